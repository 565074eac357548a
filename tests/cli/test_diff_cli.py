"""`preclint diff` as a user runs it: two checkpoints of one model, two model files, one model against
another precision; its outputs; and the mistakes that end in one line and exit 2."""
from __future__ import annotations

import json
import re
import textwrap

import pytest
import torch

from preclint.cli import main
from tests.models.diff_models import Mlp
from tests.paths import MODELS

MODEL = str(MODELS / "diff_models.py")


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A: the MLP as seed 0 builds it; B: its fc3 scaled up 30x, stored in float16."""
    folder = tmp_path_factory.mktemp("checkpoints")
    torch.manual_seed(0)
    a = Mlp().state_dict()
    b = {k: v.clone() for k, v in a.items()}
    b["fc3.weight"] *= 30.0
    b = {k: v.half() for k, v in b.items()}
    torch.save(a, folder / "a.pt")
    torch.save(b, folder / "b.pt")
    return str(folder / "a.pt"), str(folder / "b.pt")


def _diff(capsys, checkpoints, *extra):
    a, b = checkpoints
    return run(capsys, "diff", MODEL, "--model", "Mlp", "--input", "8x32", "--weights", a, "--weights", b, "-q", *extra)


@pytest.mark.slow
def test_two_checkpoints_in_json(capsys, checkpoints):
    code, out, err = _diff(capsys, checkpoints, "--output-format", "json", "--precision", "fp16,bf16")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["labels"] == ["a", "b"]
    assert [p["precision"] for p in doc["precisions"]] == ["fp16", "bf16"]
    fp16 = doc["precisions"][0]
    assert fp16["output_error"]["a"] > 0 and fp16["output_error"]["b"] > 0
    assert fp16["sentence"] == doc["summary"][0].rstrip(".")
    assert doc["parting"]["first_divergent"]["module"] == "fc3"
    assert doc["checkpoints"]["b"]["stored_in"] == "fp16" and doc["checkpoints"]["b"]["exactly_representable"]["fp16"] == 1.0
    assert doc["checkpoints"]["a"]["stored_in"] is None


@pytest.mark.slow
def test_two_checkpoints_on_the_console_sarif_and_html(capsys, checkpoints, tmp_path):
    code, out, err = _diff(capsys, checkpoints)
    assert code == 0, err
    assert out.splitlines()[2].startswith(("a's fp16 error", "b's fp16 error", "a's and b's fp16 errors"))
    assert "The runs of a and b part at fc3" in out
    assert "b: 100% exactly fp16" in out and "stored in fp16" in out
    code, out, err = _diff(capsys, checkpoints, "--output-format", "sarif")
    assert code == 0, err
    results = json.loads(out)["runs"][0]["results"]
    assert any(r["ruleId"] == "diff/runs-part" for r in results)
    assert all(r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"].endswith("diff_models.py")
               for r in results if "locations" in r)
    page = tmp_path / "diff.html"
    code, _, err = _diff(capsys, checkpoints, "--output-format", "html", "-o", str(page))
    assert code == 0, err
    html = page.read_text()
    assert "<div class='side'>" in html and len(re.findall(r"<section class='model' id='preclint-[0-9a-f]{12}-m", html)) == 2 and "<h2>Diff</h2>" in html


@pytest.mark.slow
def test_one_model_against_another_precision(capsys):
    code, out, err = run(capsys, "diff", MODEL, "--model", "ToyMoE", "--input", "1024x32", "--precision", "fp16",
                         "--against", "bf16", "--output-format", "json", "-q")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["labels"] == ["fp16", "bf16"]
    assert doc["parting"]["first_divergent"]["module"] == "router"
    (replay,) = doc["parting"]["replays"]
    assert replay["flips"] > 0 and replay["explained"] > 0.9
    assert doc["summary"][0].startswith("bf16's error is")


def _one_line_error(code, out, err, *words):
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("preclint: error: "), err
    for word in words:
        assert word in lines[0]


def test_one_checkpoint_is_not_enough(capsys, checkpoints):
    _one_line_error(*run(capsys, "diff", MODEL, "--model", "Mlp", "--weights", checkpoints[0]), "--weights A.pt --weights B.pt")


def test_a_missing_checkpoint_is_named(capsys, checkpoints, tmp_path):
    missing = str(tmp_path / "nope.pt")
    _one_line_error(*run(capsys, "diff", MODEL, "--weights", checkpoints[0], "--weights", missing), missing)


def test_an_unknown_setting_is_refused(capsys):
    _one_line_error(*run(capsys, "diff", MODEL, "--against", "int8"), "unknown --against setting 'int8'")


@pytest.mark.slow
def test_two_architectures_are_refused(capsys, tmp_path):
    source = """
        import torch
        from torch import nn


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc1 = nn.Linear(32, WIDTH)
                self.fc2 = nn.Linear(WIDTH, 10)

            def forward(self, x):
                return self.fc2(torch.relu(self.fc1(x)))


        def example_inputs():
            return (torch.randn(4, 32),)
    """
    for name, width in (("narrow", "16"), ("wide", "64")):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source).replace("WIDTH", width))
    code, out, err = run(capsys, "diff", str(tmp_path / "narrow.py"), str(tmp_path / "wide.py"), "-q")
    _one_line_error(code, out, err, "narrow and wide are not one architecture", "fc1.weight")


@pytest.mark.slow
def test_a_checkpoint_of_another_architecture_is_refused(capsys, checkpoints):
    code, out, err = run(capsys, "diff", MODEL, "--model", "resnet", "--weights", checkpoints[0], "--weights",
                         checkpoints[1], "-q")
    _one_line_error(code, out, err, "weights do not match the model")
