"""A finding's consequence in the numbers: parameters a format cannot hold (a batch norm's running_var
beyond float16's 65504, CREPE's conv2_BN) change the layer's output by far more than rounding, and
the predicted output error of the modes that store them must say so."""
import json

import pytest

from preclint.cli import main

# channels whose activations (and so their running_var) exceed float16's range, as CREPE's trained
# conv2_BN has: cast to float16, running_var is inf there and those channels output their bias
LARGE_VARIANCE = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(1, 64, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(64)
        self.conv2 = nn.Conv2d(64, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.head = nn.Linear(64, 10)
        with torch.no_grad():
            self.conv2.weight[:16] *= 300.0
            self.bn2.running_var[:16] = 1e5 * (1 + torch.rand(16))

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


torch.manual_seed(1)
model = Net().eval()
example_inputs = (torch.randn(2, 1, 16, 16),)
"""


def _json(capsys, *argv):
    code = main(list(argv) + ["--output-format", "json", "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_running_var_beyond_float16_is_in_the_predicted_output_error(tmp_path, capsys):
    # Before: fp16-full predicted 3.0e-4, as autocast (the batch norm's rounding only), while the
    # CPU probe measured 0.20: those 16 channels become constant.
    path = tmp_path / "bn.py"
    path.write_text(LARGE_VARIANCE)
    doc = _json(capsys, "check", str(path), "--precision", "fp16,fp16-full", "--probe", "cpu")
    full, autocast = doc["summary"]["fp16-full"], doc["summary"]["fp16"]
    predicted, measured = full["predicted_output"]["rel_error"], full["measured_output"]["rel_error"]
    assert measured > 0.05
    assert measured / 3 <= predicted <= measured * 3
    # autocast keeps batch norms' buffers in float32: nothing changes there
    assert autocast["predicted_output"]["rel_error"] < 1e-3
    finding = next(f for f in doc["findings"] if f["code"] == "PCL103")
    assert finding["predicted"]["fp16-full"]["rel_error"] > 0.1  # the layer's own change, not its rounding
