"""Weights computed in forward (timm's ScaledStdConv2d standardises its weight, as NF-ResNets do): the
prediction weighs the rounding of the computed weight the conv multiplies with."""
import json

import pytest

from preclint.cli import main

STANDARDISED_CONVS = """\
import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)


class StdConv(nn.Conv2d):
    \"\"\"timm's ScaledStdConv2d: the weight standardised per output channel in every forward.\"\"\"

    def forward(self, x):
        weight = F.batch_norm(self.weight.reshape(1, self.out_channels, -1), None, None, training=True,
                              momentum=0.0, eps=1e-6).reshape_as(self.weight) * self.weight[0].numel() ** -0.5
        return F.conv2d(x, weight, self.bias, self.stride, self.padding)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = StdConv(16, 64, 3, padding=1)
        self.b = StdConv(64, 128, 1)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))).mean((2, 3))


model = Net().eval()
example_inputs = (torch.rand(2, 16, 16, 16),)
"""


@pytest.mark.slow
def test_standardised_weights_are_predicted_as_the_emulation_measures(tmp_path, capsys):
    # the backward passes stopped at the inputs and never reached the computed weight: its rounding,
    # most of the error here, had no gain, and TF32 was predicted 3.3x (bf16 2.8x) below the measured
    path = tmp_path / "nf.py"
    path.write_text(STANDARDISED_CONVS)
    code = main(["check", str(path), "--precision", "tf32,bf16", "--probe", "cpu", "--output-format", "json",
                 "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for mode, entry in json.loads(out)["summary"].items():
        predicted, measured = entry["predicted_output"]["rel_error"], entry["measured_output"]["rel_error"]
        assert measured / 1.5 < predicted < measured * 1.5, (mode, predicted, measured)
