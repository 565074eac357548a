"""Outputs a random initialisation left near zero against the inputs (timm's FastViT: 4e-4 of them)
get one caveat with the figure; ordinary random-init models get none."""
import json
import textwrap

import pytest
import torch
from torch import nn

from preclint.cli import main
from preclint.reference.degenerate import NEAR_ZERO, near_zero_outputs
from tests.helpers import check


def scaled_head(scale):
    """A small MLP whose head is scaled down, as timm's EVA scales its head by head_init_scale."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 10))
    with torch.no_grad():
        model[2].weight.mul_(scale)
        model[2].bias.zero_()
    return model


def test_an_output_near_zero_against_the_inputs_gets_one_caveat_with_the_figure():
    torch.manual_seed(1)
    report, graph, _ = check(scaled_head(1e-4), (torch.randn(8, 32),), precisions=("fp16",))
    (found,) = near_zero_outputs(graph)
    assert found.ratio < NEAR_ZERO
    (caveat,) = [c for c in report.caveats if "near zero" in c]
    assert f"{found.ratio:.1e} times the inputs'" in caveat and "--weights FILE" in caveat
    assert report.summary["fp16"]["predicted_output"]["rel_error"] > 0  # relative errors still stand


def test_an_ordinary_head_gets_no_caveat():
    torch.manual_seed(1)
    report, graph, _ = check(scaled_head(1.0), (torch.randn(8, 32),), precisions=("fp16",))
    assert near_zero_outputs(graph) == [] and not report.caveats


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet18", "regnet_y_400mf", "resnext50_32x4d", "shufflenet_v2_x0_5",
                                  "convnext_tiny"])
def test_torchvision_models_at_random_init_stay_quiet(name):
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None)
    report, graph, _ = check(model, (torch.rand(1, 3, 64, 64),), precisions=("fp16",))
    assert near_zero_outputs(graph) == []
    assert not [c for c in report.caveats if "poor stand-in" in c]


FASTVIT = """
    import timm
    import torch

    torch.manual_seed(0)
    model = timm.create_model("fastvit_t8", pretrained=False, num_classes=100).eval()
    example_inputs = (torch.rand(1, 3, 64, 64),)
"""


@pytest.mark.slow
def test_fastvit_at_random_init_is_called_a_poor_stand_in(capsys, tmp_path):
    pytest.importorskip("timm")
    path = tmp_path / "fastvit.py"
    path.write_text(textwrap.dedent(FASTVIT))
    assert main(["check", str(path), "--precision", "fp16", "--output-format", "json"]) in (0, 1)
    doc = json.loads(capsys.readouterr().out)
    (caveat,) = doc["caveats"]
    assert "poor stand-in" in caveat and "the output is near zero (head.fc has RMS" in caveat
