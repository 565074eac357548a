"""`--reference-device`: float32 on the probe's device against float32 recorded on another (here the
CPU against its own other kernels), node by node, beside each against float64."""
import json

import pytest
import torch

from preclint.core.notes import texts
from preclint.cli import main
from preclint.config import Config
from preclint.probe import ProbeOptions, measure_model, merge_into_report
from preclint.probe.across import FLOOR_ADVICE
from tests.helpers import check


class TwinConvs(torch.nn.Module):
    """Two convolutions that compute the same values, one over its input channels in reverse order: in
    float64 they tie, in float32 each kernel's order of additions breaks every tie its own way, as a
    detector's near-tied scores are broken on one device and the other."""

    def __init__(self):
        super().__init__()
        self.body = torch.nn.Conv2d(64, 8, 3, padding=1)
        self.twin = torch.nn.Conv2d(64, 8, 3, padding=1)
        with torch.no_grad():
            self.twin.weight.copy_(self.body.weight.flip(1))
            self.twin.bias.copy_(self.body.bias)

    def forward(self, x):
        return self.body(x) > self.twin(x.flip(1))


def _twins():
    torch.manual_seed(0)
    return TwinConvs().eval(), (torch.randn(1, 64, 24, 24),)


@pytest.mark.slow
def test_decisions_that_go_the_other_way_on_the_other_kernels_are_measured_and_named():
    model, inputs = _twins()
    report, graph, ctx = check(model, inputs, precisions=("fp32",))
    result = measure_model(model, inputs, graph, ("fp32",), ProbeOptions(device="cpu", reference_device="cpu"))
    cross, across = result.cross_device, result.across
    assert "without oneDNN" in cross.kernels
    # the output is a mask: decisions, no values
    assert cross.between.figure.rel_error is None and cross.between.decisions == 8 * 576
    assert cross.between.figure.flip_fraction > 0.1
    (decision,) = [n.name for n in graph.nodes if n.kind == "compare"]
    measured = across.nodes[decision]
    assert measured.units == 8 * 576 and measured.flips > 0
    # the convs' own difference between kernels is each conv's local error against the other device
    (body,) = [n.name for n in graph.nodes if n.module_path == "body"]
    assert 0 < across.nodes[body].local.rel_error < 1e-5
    predicted = ctx.predictions["fp32"].nodes[decision].disagreement
    assert measured.flips / measured.units / 4 < predicted < measured.flips / measured.units * 4
    merge_into_report(report, ctx, result, Config(precisions=("fp32",)))
    assert any(FLOOR_ADVICE in n for n in texts(report.notes))
    assert any("decided" in n and "the other way" in n and "fp32 predicts" in n for n in texts(report.notes))
    entry = report.summary["fp32"]["measured_output"]
    assert entry["flip_fraction_across_devices"] > 0
    assert result.environment["reference_device"]["between"]["flip_fraction"] > 0


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_reference_device_without_the_probe_is_one_clear_error(capsys, tiny):
    code, out, err = run(capsys, "check", tiny, "--reference-device", "cpu")
    assert code == 2 and err.count("\n") == 1 and "use it with --probe" in err


def test_a_reference_device_that_is_no_device_is_one_clear_error(capsys, tiny):
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--reference-device", "gpu0")
    assert code == 2 and err.count("\n") == 1 and "not a device" in err, err


@pytest.mark.slow
def test_probe_with_a_reference_device_writes_the_comparison_in_json(capsys, tiny):
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--reference-device", "cpu", "--precision",
                         "fp32,tf32", "--output-format", "json", "--exit-zero")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["precisions"] == ["fp32", "tf32"]
    assert set(doc["environment"]["reference_device"]) >= {"between", "device_vs_float64", "reference_vs_float64"}
    assert "rel_error_across_devices" in doc["summary"]["fp32"]["measured_output"]
    assert any(n.startswith("probe: float32 across devices") for n in doc["notes"])


class RankedWidths(torch.nn.Module):
    """A detector's RPN in small: near-tied scores (the twin convolutions') ranked by a top-k, the boxes'
    widths gathered in that order, and a threshold on them (remove_small_boxes). The widths are fixed,
    half of them 0 (boxes clipped to the image on both sides): no width, and no comparison of one,
    changes between the kernels; only the ranking does."""

    def __init__(self):
        super().__init__()
        self.scores = TwinConvs()
        self.register_buffer("widths", torch.cat([torch.zeros(8 * 576), torch.full((8 * 576,), 5.0)]))

    def forward(self, x):
        twins = self.scores
        ranked = torch.cat([twins.body(x).flatten(), twins.twin(x.flip(1)).flatten()]).topk(2000).indices
        return self.widths[ranked] >= 1e-3


@pytest.mark.slow
def test_a_threshold_behind_a_reordered_ranking_is_not_counted_as_flips():
    torch.manual_seed(0)
    model, inputs = RankedWidths().eval(), (torch.randn(1, 64, 24, 24),)
    _report, graph, _ctx = check(model, inputs, precisions=("fp32",))
    result = measure_model(model, inputs, graph, ("fp32",), ProbeOptions(device="cpu", reference_device="cpu"))
    across = result.across
    (ranking,) = [n.name for n in graph.nodes if n.fn == "topk"]
    (threshold,) = [n.name for n in graph.nodes if n.kind == "compare"]
    # the near-tied scores rank otherwise on the other kernels: the output, a mask in rank order, differs
    assert result.cross_device.between.figure.flip_fraction > 0
    assert across.nodes[ranking].units == 1
    # but no width crossed the threshold: unit i there is another box than unit i here, not a flip
    measured = across.nodes[threshold]
    assert not measured.flips and not measured.units
    assert "another order" in (measured.note or "")
    # the ranking is named as reordered, its set unchanged (a reordering, no flip of its own)
    assert ranking in across.reordered and threshold in across.reordered
    assert across.nodes[ranking].flips == 0
