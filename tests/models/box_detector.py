"""A detector in miniature, as torchvision's are built: per image, a conv head scores a grid of anchor
boxes (cached on the module, as AnchorGenerator caches its anchors), a score threshold and top-k pick
the candidates, NMS the detections; the output is a list of {"boxes", "scores", "labels"} dicts."""

import torch
import torchvision
from torch import nn


class BoxDetector(nn.Module):
    def __init__(self, score_thresh: float = 0.0, classes: int = 3):
        super().__init__()
        self.head = nn.Conv2d(3, 4 + classes, kernel_size=3, padding=1)
        self.score_thresh = score_thresh
        self.cell_anchors = []  # filled by the first forward pass

    def anchors(self, height: int, width: int, like: torch.Tensor) -> torch.Tensor:
        ys, xs = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
        centers = torch.stack([xs, ys, xs, ys], dim=-1).reshape(-1, 4).to(like.dtype) * 4.0
        self.cell_anchors = [centers + torch.tensor([-6.0, -6.0, 6.0, 6.0]).to(like.dtype)]
        return self.cell_anchors[0]

    def forward(self, images: list) -> list:
        detections = []
        for image in images:
            y = self.head(image[None])[0]
            deltas = y[:4].flatten(1).T
            logits = y[4:].flatten(1).T
            boxes = self.anchors(y.shape[1], y.shape[2], y) + deltas * 4.0
            scores, labels = logits.softmax(dim=-1).max(dim=-1)
            keep = scores > self.score_thresh
            boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
            top = scores.topk(min(40, scores.numel())).indices
            boxes, scores, labels = boxes[top], scores[top], labels[top]
            keep = torchvision.ops.batched_nms(boxes, scores, labels, 0.3)
            detections.append({"boxes": boxes[keep], "scores": scores[keep], "labels": labels[keep]})
        return detections


torch.manual_seed(0)
model = BoxDetector().eval()
example_inputs = ([torch.rand(3, 32, 32)],)
