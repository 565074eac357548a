"""RoIAlign samples its features at boxes that carry the error of the regression that made them, and
its backward gives the boxes no gradient: the gains alone carried none of that error to the pooled
features and what follows them (Keypoint R-CNN's scores were predicted 12-94x under, Mask R-CNN's
masks 24x). The factor by which the op multiplies its boxes' relative error is measured by a small
perturbation (reference/analyses/sampled_inputs.py) and the boxes' error, times it, is put on the
pooled result."""
import json

import pytest

from preclint.cli import main

POOLER = """\
import torch
from torch import nn
from torchvision.ops import roi_align


class Pooler(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Conv2d(3, 8, 3, padding=1)
        self.regress = nn.Linear(16, 4)
        self.classify = nn.Linear(8 * 4 * 4, 3)
        corner = torch.rand(64, 2) * 16 + 2
        self.register_buffer("anchors", torch.cat([corner, corner + 10], dim=1))

    def forward(self, image, codes):
        boxes = {boxes}
        pooled = roi_align(self.features(image), [boxes], output_size=4, spatial_scale=1.0, sampling_ratio=2,
                           aligned=True)
        return self.classify(pooled.flatten(1))


torch.manual_seed(0)
model = Pooler().eval()
example_inputs = (torch.randn(1, 3, 32, 32), torch.randn(64, 16))
"""


def _check(tmp_path, capsys, boxes):
    path = tmp_path / "pooler.py"
    path.write_text(POOLER.format(boxes=boxes))
    code = main(["check", str(path), "--precision", "tf32,fp16,bf16", "--probe", "cpu", "--output-format", "json",
                 "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)["summary"]


@pytest.mark.slow
def test_the_error_of_boxes_reaches_what_roi_align_pools_at_them(tmp_path, capsys):
    summary = _check(tmp_path, capsys, "self.anchors + self.regress(codes) * 20")
    for mode in ("tf32", "fp16", "bf16"):
        predicted = summary[mode]["predicted_output"]["rel_error"]
        measured = summary[mode]["measured_output"]["rel_error"]
        assert measured / 3 <= predicted <= measured * 3, (mode, predicted, measured)


@pytest.mark.slow
def test_fixed_boxes_add_nothing(tmp_path, capsys):
    # boxes that carry no error (the anchors as they are) sample where they did: the pooled error is the
    # features' own, and the prediction stays within 3x of it rather than growing with the factor
    summary = _check(tmp_path, capsys, "self.anchors.clone()")
    for mode in ("tf32", "fp16", "bf16"):
        predicted = summary[mode]["predicted_output"]["rel_error"]
        measured = summary[mode]["measured_output"]["rel_error"]
        assert measured / 3 <= predicted <= measured * 3, (mode, predicted, measured)
