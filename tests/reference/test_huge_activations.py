"""Activations near 1e21: their squares overflow float32 (above 1.8e19), and preclint's own statistics
did with them: a false PCL203 ("exceeds nan"), a bf16 output predicted "finite: NO", and the output
called degenerate (rounding residue) where a product only scaled it. The statistics of such a model
are those of the same model at a scale whose squares fit, scaled."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from preclint.reference.analyses.terms import dot_terms
from preclint.reference.degenerate import degenerate_outputs
from tests.helpers import check

HUGE = 2.0 ** 70  # 1.2e21, a power of two: the scaled model rounds exactly as the unscaled one


class Scaled(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        h = self.fc1(x) * self.scale
        return self.fc2(torch.relu(h)) / self.scale


def _checked(scale: float, precisions=("bf16", "tf32")):
    torch.manual_seed(0)
    model = Scaled(scale).eval()
    return check(model, (torch.randn(4, 16),), precisions=precisions)


@pytest.mark.slow
def test_activations_near_1e21_are_predicted_as_the_same_model_at_a_smaller_scale():
    report, graph, _ = _checked(HUGE)
    assert graph.get("fc2").out.absmax > 1e20  # the activations do reach 1e21
    assert "PCL203" not in {f.code for f in report.findings}, [f.message for f in report.findings]
    assert degenerate_outputs(graph) == []  # divided by 1e21, not rounding residue
    # at 2^20 (1e6: no square overflows) the biases weigh as little as at 2^70: the same model, scaled
    unit, _, _ = _checked(2.0 ** 20)
    for mode in ("bf16", "tf32"):
        huge = report.summary[mode]["predicted_output"]
        assert huge["finite"] is True
        assert huge["rel_error"] == pytest.approx(unit.summary[mode]["predicted_output"]["rel_error"], rel=1e-3)


def test_scaled_terms_are_the_same_figures_and_stay_finite_where_squares_overflow():
    torch.manual_seed(0)
    layer = nn.Linear(64, 32)
    x = torch.randn(8, 64)
    plain = dot_terms(None, (x,), {}, layer)
    assert torch.equal(dot_terms(None, (x,), {}, layer, scaled=True), plain)  # powers of two: exact
    big = dot_terms(None, (x * HUGE,), {}, layer, scaled=True)
    assert not torch.isfinite(dot_terms(None, (x * HUGE,), {}, layer)).all()  # the float32 squares overflow
    assert torch.equal(big, plain * HUGE)
    small = dot_terms(None, (x / HUGE,), {}, layer, scaled=True)  # squares of 1e-21 vanish in float32
    assert torch.equal(small, plain / HUGE) and bool((small > 0).all())


def test_a_residue_scaled_by_a_product_is_still_residue():
    class Residue(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            y = self.fc(x)
            return ((y + 1e-7) - y) * 1e6  # rounding residue (a few units in the last place), scaled up

    torch.manual_seed(0)
    _, graph, _ = check(Residue().eval(), (torch.randn(4, 16),), precisions=("bf16",))
    assert [d.node for d in degenerate_outputs(graph)] == ["sub"]
