"""The fp32 mode: float32's own rounding (TF32 off) against float64, predicted through the same error
model as the reduced precisions, and the decisions that flip at that level (PCL301)."""
import math

import pytest
import torch

from preclint.core.numerics import MODES
from preclint.measure.runners import run_reference
from preclint.predict.accumulation import FLOAT32_ACCUMULATION
from tests.helpers import check

U = 2.0 ** -24


def _conv():
    torch.manual_seed(0)
    return torch.nn.Conv2d(128, 16, 3, padding=1).eval(), (torch.randn(1, 128, 8, 8),)


def test_a_conv_under_fp32_errs_by_float32_accumulation_over_its_length():
    model, inputs = _conv()
    _report, graph, ctx = check(model, inputs, precisions=("fp32", "tf32"))
    (conv,) = [n for n in graph.nodes if n.kind == "conv"]
    k = conv.reduction_length
    assert k == 128 * 9
    predicted = ctx.predictions["fp32"].rel_error
    law = FLOAT32_ACCUMULATION[0] * U * math.sqrt(k)
    with torch.no_grad():
        measured64 = run_reference(model, inputs)
        error = model(*inputs).double() - measured64
    measured = float(error.norm() / measured64.norm())
    # the CPU's direct convolution adds its terms one after another: the law's own case
    assert measured / 3 < predicted < measured * 3
    # float32 errs 2^13 times less than TF32, but grows with K: the floor is no constant
    assert 10 * U < predicted < ctx.predictions["tf32"].rel_error / 50
    assert predicted > law / 3


def test_values_entering_the_graph_and_exact_ops_add_nothing_under_fp32():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Flatten()).eval()
    _report, graph, ctx = check(model, (torch.randn(4, 8),), precisions=("fp32",))
    nodes = ctx.predictions["fp32"].nodes
    for node in graph.nodes:
        if node.kind in ("input",) or node.fn in ("relu", "flatten", "parameter"):
            assert nodes[node.name].local == 0, node.name
    (linear,) = [n for n in graph.nodes if n.kind == "linear"]
    assert nodes[linear.name].local > 0


def test_the_fp32_mode_is_one_row_of_the_modes_table():
    mode = MODES["fp32"]
    assert mode.floor and mode.low is None and mode.dot_format.unit_roundoff == U
    assert [m for m in MODES.values() if m.floor] == [mode]


def _near_uniform_scores():
    """A detector's class head at random init: near-uniform scores whose top five sit float32's
    rounding apart in some rows (PCL301's fp32 example)."""
    from preclint.rules.model.decision_flip import DecisionFlip

    model, inputs = next(e for e in DecisionFlip.bad if e.options.get("precisions") == ("fp32",)).build()
    return model.eval(), inputs


@pytest.mark.slow
def test_decisions_that_flip_in_float32_are_reported_as_the_floor_with_their_rate():
    model, inputs = _near_uniform_scores()
    report, _graph, ctx = check(model, inputs, precisions=("fp32",))
    (finding,) = [f for f in report.findings if f.code == "PCL301"]
    assert finding.precisions == ("fp32",)
    assert "flip at float32's own level; no precision setting fixes that" in finding.message
    assert "sort ties" in finding.message
    predicted = finding.predicted["fp32"].flip_fraction
    with torch.no_grad():
        measured = float((model(*inputs).sort(-1).values != run_reference(model, inputs).sort(-1).values)
                         .any(-1).float().mean())
    assert measured > 0 and measured / 3 < predicted < measured * 3


def test_a_threshold_on_values_exactly_zero_is_not_predicted_to_flip():
    """torchvision's remove_small_boxes compares widths with 1e-3; a box clipped to the image on both
    sides has width exactly 0, which no rounding moves (the fp32 mode once predicted 8 flips there)."""
    from preclint.core.ir import Kind, Node
    from preclint.reference.analyses.margins import decision_margins

    widths = torch.tensor([0.0, 0.0, 0.0015, 25.0])
    node = Node("ge", Kind.COMPARE, "torch.ge", fn="ge")
    margins = decision_margins(node, (widths, 1e-3), {})
    assert torch.isinf(margins[:2]).all() and torch.allclose(margins[2], torch.tensor(5e-4, dtype=torch.float64))
    # at a threshold of 0 a zero is the boundary itself
    assert decision_margins(node, (widths, 0.0), {})[0] == 0
