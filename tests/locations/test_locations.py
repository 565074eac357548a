"""Findings on ops in library code point at the library's line and at the user's lines that reach it,
however preclint is started (``python -m preclint``, the console script, in-process).
"""
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from preclint.cli import main

MODEL = textwrap.dedent("""\
    import torch
    from torch import nn
    from torchvision.models.resnet import BasicBlock


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = BasicBlock(8, 8)

        def forward(self, x):
            return self.block(x)


    def example_inputs():
        torch.manual_seed(0)
        return (torch.randn(1, 8, 8, 8) * 1e5,)  # the block's first conv overflows float16
    """)
BUILD_LINE, CALL_LINE = 9, 12
ARGS = ["check", "model.py", "--select", "PCL101", "--precision", "fp16", "--output-format", "json"]


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _conv1_overflow(doc):
    (finding,) = [f for f in doc["findings"] if f["module"] == "block.conv1"]
    return finding


def assert_points_into_torchvision(finding):
    location = finding["location"]
    assert location["path"] == "torchvision/models/resnet.py" and location["library"] is True
    assert location["line"] > 1
    related = {(r["path"], r["line"]) for r in finding["related"]}
    assert ("model.py", CALL_LINE) in related and ("model.py", BUILD_LINE) in related


def _console_script() -> str:
    script = Path(sys.executable).parent / ("preclint.exe" if os.name == "nt" else "preclint")
    return str(script) if script.exists() else shutil.which("preclint")


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("launcher", ["python -m preclint", "console script"])
def test_library_location_whatever_starts_preclint(project, launcher):
    command = [sys.executable, "-m", "preclint"] if launcher == "python -m preclint" else [_console_script()]
    done = subprocess.run(command + ARGS, capture_output=True, text=True, timeout=300, cwd=project)
    assert done.returncode == 1, done.stderr
    assert "<frozen" not in done.stdout and "<string>" not in done.stdout and "bin/preclint" not in done.stdout
    assert_points_into_torchvision(_conv1_overflow(json.loads(done.stdout)))


@pytest.mark.slow
def test_library_model_without_user_code_keeps_its_library_location(capsys, project):
    """A torchvision model named by module (no file of the user's): the finding stays at torchvision's
    line; concise output never names preclint's or Python's own files."""
    code = main(["check", "torchvision.models:mobilenet_v3_small", "--input-shape", "1,3,64,64", "--precision",
                 "fp16", "--output-format", "concise", "--select", "PCL105"])
    out = capsys.readouterr().out
    assert code == 1
    # (the findings, then the caveats: mobilenet's random-init output is near zero)
    findings = [line for line in out.splitlines()[:-1] if not line.startswith("warning: ")]
    assert findings and all(line.startswith("torchvision/models/mobilenetv3.py:") for line in findings), out


@pytest.mark.slow
def test_sarif_and_github_annotate_the_users_line(capsys, project):
    main(ARGS[:-1] + ["sarif"])
    result = json.loads(capsys.readouterr().out)["runs"][0]["results"][0]
    where = result["locations"][0]["physicalLocation"]
    assert where["artifactLocation"]["uri"] == "model.py" and where["region"]["startLine"] == CALL_LINE
    libraries = [r for r in result["relatedLocations"] if r["physicalLocation"]["artifactLocation"]["uriBaseId"] == "PYTHONPATH"]
    assert libraries[0]["physicalLocation"]["artifactLocation"]["uri"] == "torchvision/models/resnet.py"
    main(ARGS[:-1] + ["github"])
    annotation = capsys.readouterr().out.splitlines()[0]
    assert annotation.startswith(f"::error file=model.py,line={CALL_LINE},")
    assert "torchvision/models/resnet.py:" in annotation


@pytest.mark.slow
def test_baseline_keys_on_the_library_location(capsys, project):
    """The user's lines move; the finding, at torchvision's line, stays known to the baseline."""
    assert main(ARGS + ["--write-baseline", "baseline.json"]) == 0
    capsys.readouterr()
    (project / "model.py").write_text("# a comment\n\n" + MODEL)
    assert main(ARGS + ["--baseline", "baseline.json"]) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []


def test_suppression_on_the_users_call_line(capsys, project):
    lines = MODEL.splitlines()
    lines[CALL_LINE - 1] += "  # preclint: ignore[PCL101]"
    (project / "model.py").write_text("\n".join(lines) + "\n")
    assert main(ARGS) == 0
    assert json.loads(capsys.readouterr().out)["findings"] == []
