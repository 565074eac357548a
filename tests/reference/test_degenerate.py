"""Outputs that say nothing about precision (all zero, or rounding residue) are called out, and their
relative errors (0/0, noise over noise) are not reported."""
import json
import textwrap

import jsonschema

import pytest
import torch
from torch import nn

from preclint.cli import main
from preclint.reference.degenerate import degenerate_outputs
from tests.helpers import check
from tests.paths import DATA

# torchvision's VisionTransformer initialises its head to zero, as vit_b_16 does: every output is 0
ZERO_HEAD = """
    import torch
    from torchvision.models.vision_transformer import VisionTransformer


    def model():
        torch.manual_seed(0)
        return VisionTransformer(image_size=32, patch_size=8, num_layers=1, num_heads=2, hidden_dim=32,
                                 mlp_dim=64, num_classes=10)


    def example_inputs():
        torch.manual_seed(0)
        return (torch.randn(2, 3, 32, 32),)
"""


class Residue(nn.Module):
    """A difference of two nearly equal values: 0 in float32, 1e-14 in float64."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x):
        y = self.fc(x)
        return (y + 1e-14) - y


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["check"], ["check", "--probe", "cpu"]], ids=["check", "probe"])
def test_zero_initialised_head_gets_a_note_and_no_relative_error(capsys, tmp_path, argv):
    path = tmp_path / "vit.py"
    path.write_text(textwrap.dedent(ZERO_HEAD))
    code = main(argv + [str(path), "--model", "model", "--output-format", "json", "--precision", "fp16,bf16"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    (note,) = doc["caveats"]
    assert "heads.head is all zero" in note and "--weights FILE" in note and "vacuous" in note
    for entry in doc["summary"].values():
        assert entry["predicted_output"]["rel_error"] is None
        if "measured_output" in entry:
            assert entry["measured_output"]["rel_error"] is None
    assert not [f for f in doc["findings"] if f["code"] == "PCL900"]


def test_rounding_residue_is_degenerate_and_a_healthy_output_is_not():
    torch.manual_seed(0)
    report, graph, _ = check(Residue(), (torch.randn(4, 16),), precisions=("fp16",))
    assert [d.node for d in degenerate_outputs(graph)] == ["sub"]
    assert report.summary["fp16"]["predicted_output"]["rel_error"] is None
    healthy = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    report, graph, _ = check(healthy, (torch.randn(4, 16),), precisions=("fp16",))
    assert degenerate_outputs(graph) == [] and report.summary["fp16"]["predicted_output"]["rel_error"] > 0
    assert not report.caveats


def test_a_small_output_of_a_dot_product_is_not_residue():
    """A head with weights 1e-12: its output is tiny, but as large as the terms of its dot product, so
    it is a real value (that float16 flushes to zero), not rounding residue."""
    torch.manual_seed(0)
    head = nn.Linear(16, 4)
    with torch.no_grad():
        head.weight.mul_(1e-12)
        head.bias.zero_()
    _, graph, _ = check(nn.Sequential(nn.Linear(16, 16), head), (torch.randn(4, 16),), precisions=("fp16",))
    assert degenerate_outputs(graph) == []


@pytest.mark.slow
def test_every_format_shows_the_caveat(capsys, tmp_path):
    path = tmp_path / "vit.py"
    path.write_text(textwrap.dedent(ZERO_HEAD))
    outputs = {}
    for fmt in ("full", "concise", "github", "sarif"):
        main(["check", str(path), "--model", "model", "--precision", "fp16", "--output-format", fmt, "--color", "never"])
        outputs[fmt] = capsys.readouterr().out
    assert "warning: the output is degenerate" in outputs["full"]
    assert "warning: the output is degenerate" in outputs["concise"]
    assert "::warning title=preclint::the output is degenerate" in outputs["github"]
    sarif = json.loads(outputs["sarif"])
    jsonschema.validate(sarif, json.loads((DATA / "sarif-schema-2.1.0.json").read_text()))
    (notification,) = sarif["runs"][0]["invocations"][0]["toolExecutionNotifications"]
    assert "--weights FILE" in notification["message"]["text"]


# ultralytics' Conv blocks at random init: BatchNorm at its default statistics passes on a conv whose
# default init shrinks the signal, so activations fall from 0.3 to 1e-13 over 24 blocks (YOLOv8n's
# backbone: 0.17 to 5e-10), and float16 underflow findings describe the weights, not the model
VANISHING = """
    import torch
    from torch import nn

    torch.manual_seed(0)


    def block(c_in, c_out):
        return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.SiLU())


    model = nn.Sequential(block(3, 16), *[block(16, 16) for _ in range(23)]).eval()
    example_inputs = (torch.rand(1, 3, 32, 32),)
"""


@pytest.mark.slow
def test_vanishing_activations_are_called_out_once_with_the_figure(capsys, tmp_path):
    path = tmp_path / "yolo_like.py"
    path.write_text(textwrap.dedent(VANISHING))
    code = main(["check", str(path), "--precision", "fp16", "--output-format", "json", "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    stand_in = [c for c in doc.get("caveats", []) if "poor stand-in" in c]
    assert len(stand_in) == 1 and "activations shrink by" in stand_in[0] and "--weights" in stand_in[0]
    underflow = [f for f in doc["findings"] if f["code"] == "PCL105"]
    assert underflow and all("likely describes these weights rather than the model" in f["message"] for f in underflow)


def test_a_network_that_keeps_its_scale_is_no_stand_in_case():
    from preclint.reference.degenerate import scale_drift

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 16, 3), nn.ReLU())
    _, graph, _ = check(model, (torch.rand(1, 3, 16, 16),), precisions=("fp16",))
    assert scale_drift(graph) is None
