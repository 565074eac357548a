"""NMS margins by consequence: which of an NMS's boxes a swap in score order changes, where a box is
judged by its position (as the probe judges an NMS, measure/detections.changed_decisions).

Two boxes that overlap beyond the IoU threshold and swap their order make NMS keep the other one,
which sits where the first did (IoU > the threshold >= SAME_BOX_IOU): a detection in the same place,
no changed decision for a test that matches boxes. A swap changes decisions only through what
follows: the new winner suppresses boxes the old one did not, or lets through boxes it suppressed.
So each candidate swap is played out (the lower box moved just above the higher, everything else in
place), and the boxes whose outcome changes by position get the swap's score gap as their margin.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, List, Optional, Tuple

if TYPE_CHECKING:
    import torch

# IoU at which two kept boxes are the same detection: measure/detections.MATCH_IOU, which the probe
# judges an NMS with (the reference stage cannot import the measure stage; a test holds them equal).
SAME_BOX_IOU = 0.5
# Swaps played out per NMS call, the smallest score gaps first: beyond a few hundred the gaps are
# far above any precision's error of the scores. Each costs one NMS over the candidates, so a call
# over many candidates plays out fewer: SWAP_WORK candidates' worth of NMS in all (64 swaps of 1000
# boxes, 16 of an RPN's 4000), never fewer than MIN_SWAPS.
MAX_SWAPS = 256
MIN_SWAPS = 16
SWAP_WORK = 64_000


def swap_margins(boxes: "torch.Tensor", pairs: List[Tuple[int, int, float]], threshold: float) -> "torch.Tensor":
    """Per candidate (in score order, highest first), the smallest score gap of a swap
    whose consequence changes that box's outcome by position; inf where no swap does.

    ``boxes``: (n, 4) float64 in score order, with batched NMS's class offsets applied where the
    caller has classes; ``pairs``: (higher position, lower position, gap) of overlapping candidates."""
    import torch

    n = boxes.shape[0]
    margins = torch.full((n,), math.inf, dtype=torch.float64)
    if not pairs:
        return margins
    pairs = sorted(pairs, key=lambda p: p[2])[:max(MIN_SWAPS, min(MAX_SWAPS, SWAP_WORK // n))]
    ranks = torch.arange(n, 0, -1, dtype=torch.float64)  # forces an order: distinct, descending
    kept = _kept(boxes, ranks, threshold)
    for high, low, gap in pairs:
        swapped = torch.cat([torch.arange(high), torch.tensor([low]), torch.arange(high, low),
                             torch.arange(low + 1, n)])
        new_ranks = torch.empty_like(ranks)
        new_ranks[swapped] = ranks
        changed = _changed_by_position(boxes, kept, _kept(boxes, new_ranks, threshold))
        if changed is not None:
            margins[changed] = torch.minimum(margins[changed], torch.full_like(margins[changed], gap))
    return margins


def _kept(boxes: "torch.Tensor", ranks: "torch.Tensor", threshold: float) -> "torch.Tensor":
    """Which boxes NMS keeps when they arrive in the order of ``ranks`` (highest first), as a mask."""
    import torch

    mask = torch.zeros(boxes.shape[0], dtype=torch.bool)
    mask[torch.ops.torchvision.nms(boxes, ranks, float(threshold))] = True
    return mask


def _changed_by_position(boxes: "torch.Tensor", kept: "torch.Tensor", now: "torch.Tensor") -> Optional["torch.Tensor"]:
    """The boxes whose outcome changed, those lost and added that no box on the other side stands in
    for (IoU >= SAME_BOX_IOU, matched greedily, highest IoU first); None where none did."""
    import torch

    lost = torch.nonzero(kept & ~now).flatten()
    added = torch.nonzero(now & ~kept).flatten()
    if not len(lost) and not len(added):
        return None
    unmatched_lost, unmatched_added = set(lost.tolist()), set(added.tolist())
    if len(lost) and len(added):
        iou = _iou(boxes[added], boxes[lost])
        rows, cols = torch.nonzero(iou >= SAME_BOX_IOU, as_tuple=True)
        for k in torch.argsort(iou[rows, cols], descending=True).tolist():
            a, b = int(added[rows[k]]), int(lost[cols[k]])
            if a in unmatched_added and b in unmatched_lost:
                unmatched_added.discard(a)
                unmatched_lost.discard(b)
    changed = sorted(unmatched_lost | unmatched_added)
    return torch.tensor(changed, dtype=torch.long) if changed else None


def _iou(a: "torch.Tensor", b: "torch.Tensor") -> "torch.Tensor":
    """IoU of every box of ``a`` with every box of ``b`` (x1 y1 x2 y2)."""
    import torch

    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    wh = (torch.min(a[:, None, 2:], b[None, :, 2:]) - torch.max(a[:, None, :2], b[None, :, :2])).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-300), torch.zeros_like(union))
