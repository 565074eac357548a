"""Ties float32's rounding made (a saturated softmax: scores float64 tells apart, equal in float32) are
decided otherwise against float64 under every precision: a random-init SSDlite keeps none of its
detections, so PCL301 predicts its top-k and sort to flip where an exact tie (a property of the input)
stays unflipped (tests/rules/test_decision_ties.py)."""
import pytest
import torch

from preclint.probe import ProbeOptions, measure_model, merge_into_report
from preclint.reference.analyses.rounded_ties import rounded_tie_count
from tests.helpers import check


def _saturated_detector():
    from tests.models.box_detector import BoxDetector

    torch.manual_seed(0)
    model = BoxDetector().eval()
    with torch.no_grad():  # class logits of order 1e-11, as a random-init SSDlite's after its vanishing backbone:
        model.head.weight[4:].mul_(1e-11)  # below float32's resolution of probabilities, above float64's
        model.head.bias[4:].mul_(1e-11)
    return model, ([torch.rand(3, 32, 32)],)


def test_a_softmax_that_rounds_distinct_inputs_to_one_value_makes_ties():
    logits = torch.tensor([[1e-11, 2e-11, 0.0], [1.0, 2.0, 3.0]])
    probabilities = logits.softmax(dim=-1)
    assert probabilities[0].unique().numel() == 1  # 1/3 three times in float32
    assert rounded_tie_count(probabilities, logits.double().softmax(dim=-1)) == 2
    # equal inputs give equal results in any format, and float64 cannot tell 1e-20 from 0 either:
    # no tie of float32's making
    for same in (torch.zeros(2, 3), torch.tensor([[1e-20, 2e-20, 0.0]])):
        assert rounded_tie_count(same.softmax(dim=-1), same.double().softmax(dim=-1)) == 0


def test_decisions_on_saturated_scores_are_predicted_to_flip_under_every_precision():
    model, inputs = _saturated_detector()
    report, graph, ctx = check(model, inputs)
    found = {f.op: f for f in report.findings if f.code == "PCL301"}
    assert "Tensor.topk" in found, [f.message for f in report.findings]
    topk = found["Tensor.topk"]
    assert set(topk.precisions) == {"tf32", "fp16", "bf16"}
    assert all(topk.predicted[m].flip_fraction == 0.5 for m in ("tf32", "fp16", "bf16"))
    assert "ties float32's own rounding made" in topk.message and "softmax" in topk.message
    assert "not counted as flips" not in topk.message


@pytest.mark.slow
def test_the_probe_confirms_the_flips_on_saturated_scores():
    model, inputs = _saturated_detector()
    modes = ("tf32", "bf16")
    report, graph, ctx = check(model, inputs, precisions=modes)
    result = measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu"))
    merge_into_report(report, ctx, result)
    for mode in modes:
        changes = result.modes[mode].detections
        assert changes.reference > 10 and changes.flip_fraction > 0.5, (mode, changes.describe())
    (topk,) = [f for f in report.findings if f.code == "PCL301" and f.op == "Tensor.topk"]
    assert topk.status == "confirmed"
