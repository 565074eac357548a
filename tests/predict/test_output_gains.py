"""Each output of a model that returns several is predicted from a backward pass of its own
(reference/analyses/output_gains.py), and a cast model's inputs count their cast's rounding where no
dot product reads them. A KV-cache decode step returns its logits beside the key and value caches
(each the input cache with one new row): apportioned op by op, the caches took the new row's error
on every row and the logits were predicted 12-14x under the CPU emulation's measurement; the caches
passed through a cast model were 7.5x under (the cast of the input cache was not counted)."""
import pytest
import torch
from torch import nn

import preclint
from tests.models.kv_decode_step import DecodeStep

MODES = ("tf32", "fp16", "bf16", "fp16-full", "bf16-full")


def _ratios(report, mode):
    entry = report.to_dict()["summary"][mode]
    predicted = [o["rel_error"] for o in entry["outputs"]]
    measured = [o["rel_error"] for o in entry["measured_output"]["outputs"]]
    return [m / p for p, m in zip(predicted, measured)]


@pytest.mark.slow
def test_a_decode_steps_logits_and_caches_are_each_predicted_within_3x():
    torch.manual_seed(0)
    inputs = (torch.randint(0, 256, (2, 1)), 3 * torch.randn(2, 4, 31, 16), 3 * torch.randn(2, 4, 31, 16))
    report = preclint.check(DecodeStep().eval(), preclint.inputs(*inputs), precisions=MODES, probe="cpu")
    for mode in MODES:
        ratios = _ratios(report, mode)
        assert len(ratios) == 3
        assert all(1 / 3 < r < 3 for r in ratios), (mode, ratios)


class FirstOfTwo(nn.Module):
    """Returns an input as it came (reshaped) beside a linear layer's output of it."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, passed):
        return self.fc(x), passed.reshape(-1)


def test_an_input_a_cast_model_returns_carries_the_rounding_of_its_cast():
    torch.manual_seed(0)
    report = preclint.check(FirstOfTwo().eval(), preclint.inputs(torch.randn(8, 16), torch.randn(8, 16)),
                            precisions=("fp16", "fp16-full"))
    summary = report.to_dict()["summary"]
    passed_full = summary["fp16-full"]["outputs"][1]["rel_error"]
    # float16 rounds a value spread over its binades by about 0.42 u (u = 2^-11) in RMS
    assert 1e-4 < passed_full < 4e-4
    assert summary["fp16"]["outputs"][1]["rel_error"] < 1e-6  # autocast leaves the input float32
