"""Probabilities a trained classifier saturates round by far less than ordinary values: a face
probability of 1 - 1e-7 is 1.0 in float16, off by 1e-7, not by C_OUTPUT u (2e-4). A cast model's
float16 softmax of a trained CNN was predicted 2.0e-4 against 3.8e-7 measured; the rounding of the
reference probabilities is measured instead (reference/analyses/exact_rounding.py)."""
import json

import pytest

from preclint.cli import main

SATURATED = """\
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2), nn.Softmax(dim=1)).eval()
with torch.no_grad():
    # confident, as a trained face classifier: logits 16 apart, probabilities 1 - 1e-7 and 1e-7
    model[2].weight.mul_(0.01)
    model[2].bias.copy_(torch.tensor([8.0, -8.0]))
example_inputs = (torch.randn(32, 16),)
"""


@pytest.mark.slow
def test_saturated_probabilities_are_predicted_from_their_own_rounding(tmp_path, capsys):
    path = tmp_path / "classifier.py"
    path.write_text(SATURATED)
    code = main(["check", str(path), "--precision", "fp16-full,bf16-full", "--probe", "cpu", "--output-format", "json",
                 "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for mode in ("fp16-full", "bf16-full"):
        entry = json.loads(out)["summary"][mode]
        predicted, measured = entry["predicted_output"]["rel_error"], entry["measured_output"]["rel_error"]
        assert measured / 3 <= predicted <= measured * 3, (mode, predicted, measured)
