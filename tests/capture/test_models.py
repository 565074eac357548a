"""Real torchvision architectures (random init, fixed seeds) through capture, reference pass and rules."""
import math

import pytest
import torch
import torchvision

from preclint.core.notes import texts
from preclint.core.ir import Kind
from preclint.reference.analyses.margins import DecisionMargins
from tests.helpers import check, codes


def build(factory, *shape, **kwargs):
    torch.manual_seed(0)
    model = factory(**kwargs).eval()
    return model, (torch.rand(*shape),)


def in_range(value, low, high):
    return value is not None and low <= value <= high


@pytest.mark.slow
@pytest.mark.parametrize("factory", [torchvision.models.resnet18, torchvision.models.resnet50])
def test_resnets_trace_with_fx_and_predict_ordinary_errors(factory):
    report, graph, ctx = check(*build(factory, 1, 3, 224, 224))
    assert graph.capture == "fx"
    convs = [n for n in graph.nodes if n.kind == Kind.CONV]
    assert len(convs) in (20, 53)
    conv1 = graph["conv1"]
    assert conv1.reduction_length == 3 * 7 * 7 and conv1.groups == 1
    assert conv1.params == ("conv1.weight",)
    assert conv1.out.shape == (1, 64, 112, 112)
    # batch norms keep their inputs' statistics from before ReLU(inplace=True) changed them
    bn1 = graph["bn1"]
    assert bn1.out.absmax > graph["relu"].out.absmax * 0 and any(
        s.absmin_nonzero < 0.5 for s in bn1.outputs)
    assert graph["relu"].input_stats[0].absmax == bn1.out.absmax
    # well-scaled random-init resnets: errors of order the unit roundoff, nothing overflows
    u16, u8 = 2.0**-11, 2.0**-8
    summary = report.summary
    assert in_range(summary["tf32"]["predicted_output"]["rel_error"], 0.3 * u16, 4 * u16)
    assert in_range(summary["fp16"]["predicted_output"]["rel_error"], 0.3 * u16, 4 * u16)
    assert in_range(summary["bf16"]["predicted_output"]["rel_error"], 0.3 * u8, 4 * u8)
    assert all(summary[m]["predicted_output"]["finite"] for m in summary)
    assert codes(report) == set()


@pytest.mark.slow
def test_resnext_grouped_convs_are_reported_for_engines_only():
    model, inputs = build(torchvision.models.resnext50_32x4d, 1, 3, 128, 128)
    report, graph, _ = check(model, inputs, precisions=("fp16", "fp16-full"))
    grouped = [f for f in report.findings if f.code == "PCL205"]
    assert len(grouped) == 1 and grouped[0].precisions == ("fp16-full",)
    assert "16 grouped convolutions" in grouped[0].message
    assert graph["layer1_0_conv2"].groups == 32


@pytest.mark.slow
def test_mobilenet_depthwise_convs():
    model, inputs = build(torchvision.models.mobilenet_v3_small, 1, 3, 128, 128)
    report, graph, _ = check(model, inputs, precisions=("bf16-full",), select=["PCL205"])
    depthwise = [f for f in report.findings if "depthwise" in f.message]
    assert len(depthwise) == 1
    assert depthwise[0].predicted["bf16-full"].rel_error is not None


@pytest.mark.slow
def test_vit_b_16_is_quiet_at_default_settings():
    torch.manual_seed(0)
    model = torchvision.models.vit_b_16().eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)  # torchvision zero-inits the head: outputs would be 0
    report, graph, _ = check(model, (torch.rand(1, 3, 224, 224),))
    assert graph.capture == "fx"
    assert report.findings == [], [f.message for f in report.findings]
    attention = [n for n in graph.nodes if n.fn == "multi_head_attention"]
    assert len(attention) == 12
    for mode, u in (("tf32", 2.0**-11), ("fp16", 2.0**-11), ("bf16", 2.0**-8)):
        assert in_range(report.summary[mode]["predicted_output"]["rel_error"], 0.1 * u, 10 * u), mode


@pytest.mark.slow
def test_detector_falls_back_to_function_mode_capture():
    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, box_score_thresh=0.0).eval()
    report, graph, _ = check(model, ([torch.rand(3, 320, 320)],))
    assert graph.capture == "function-mode"
    assert any("torch.fx could not trace" in note for note in texts(report.notes))
    kinds = {n.kind for n in graph.nodes}
    assert {Kind.CONV, Kind.BATCHNORM, Kind.DECISION, Kind.COMPARE} <= kinds
    # the same module paths as FX would give
    assert graph.get("backbone_body_0_0") is not None or any(n.module_path.startswith("backbone.body") for n in graph.nodes)
    nms = [n for n in graph.nodes if n.fn == "nms"]
    assert nms and all(n.record(DecisionMargins) is not None for n in nms)
    # decisions in a detector flip under reduced precision: torchvision's own tests compare scores only
    flips = [f for f in report.findings if f.code == "PCL301"]
    assert flips
    for f in flips:
        for mode, figure in f.predicted.items():
            assert 0.0 <= figure.flip_fraction <= 1.0
    out = report.summary["fp16"]["predicted_output"]
    assert out["rel_error"] is not None and math.isfinite(out["rel_error"])
