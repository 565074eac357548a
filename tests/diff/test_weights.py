"""A checkpoint's values against the low formats, and its modules' figures (preclint/diff/weights.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from preclint.diff.weights import checkpoint_facts, stored_sentence


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8, 4))


@pytest.mark.parametrize("dtype, name", [(torch.float16, "fp16"), (torch.bfloat16, "bf16")])
def test_a_checkpoint_stored_in_a_low_format_is_recognised(dtype, name):
    net = _net()
    with torch.no_grad():
        for t in list(net.parameters()) + list(net.buffers()):
            if t.is_floating_point():
                t.copy_(t.to(dtype).float())
    facts = checkpoint_facts(net)
    assert facts.exact[name] == 1.0
    assert facts.stored_in() == name
    assert f"stored in {name}" in stored_sentence("B", facts)


def test_float32_weights_are_rarely_exact_low_values():
    facts = checkpoint_facts(_net())
    # what is exact: the batch norm's ones and zeros, and the odd value that happens to be
    assert facts.exact["fp16"] < 0.2 and facts.stored_in() is None
    assert "not stored in a low format" in stored_sentence("A", facts)


def test_the_folded_batch_norm_scale_is_gamma_over_the_running_deviation():
    net = _net()
    with torch.no_grad():
        net[1].running_var.fill_(1e-4)
        net[1].weight.fill_(2.0)
    figures = checkpoint_facts(net).modules["1"]
    assert figures.folded_scale == pytest.approx(2.0 / (1e-4 + net[1].eps) ** 0.5, rel=1e-6)
    assert figures.weight_absmax == 2.0
