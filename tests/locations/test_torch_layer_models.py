"""A model made of torch's own layers alone (a bare ``nn.Conv2d``, an ``nn.Sequential`` of them), the
commonest user model: its findings point at the line of the user's file that builds it, never at
whoever ran preclint (the console script's ``sys.exit(main())``, a test), and its layers are named as
the user indexes them (``model[0] (Linear)``), not ``0``."""
import json
import subprocess
import sys
import textwrap

import pytest

from preclint.cli import main
from tests.locations.test_locations import _console_script

SEQUENTIAL = textwrap.dedent("""\
    import torch
    from torch import nn

    net = nn.Sequential(
        nn.Linear(256, 1024),
        nn.GELU(),
        nn.Linear(1024, 256),
    )
    example_inputs = (torch.randn(4, 256) * 1e5,)  # the first Linear overflows float16
    """)
CONV = textwrap.dedent("""\
    import torch
    from torch import nn

    model = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    example_inputs = (torch.randn(1, 3, 16, 16) * 1e5,)
    """)
ARGS = ["--select", "PCL101", "--precision", "fp16,bf16", "--output-format", "json"]


def _check(capsys, tmp_path, monkeypatch, text, *more):
    (tmp_path / "model.py").write_text(text)
    monkeypatch.chdir(tmp_path)
    assert main(["check", "model.py", *ARGS, *more]) == 1
    return json.loads(capsys.readouterr().out)


def test_sequential_of_torch_layers_points_at_the_entry_and_names_it(capsys, tmp_path, monkeypatch):
    doc = _check(capsys, tmp_path, monkeypatch, SEQUENTIAL, "--model", "net", "--select", "ALL")
    (finding,) = [f for f in doc["findings"] if f["code"] == "PCL101"]
    assert (finding["location"]["path"], finding["location"]["line"]) == ("model.py", 5)  # nn.Linear(256, 1024)
    assert finding["message"].startswith("net[0] (Linear) overflows float16")
    assert "keep net[0] in float32" in finding["fix"]
    labels = [t["module"] for t in doc["summary"]["bf16"]["top_layers"]]
    assert labels[:2] == ["net[0] (Linear)", "net[2] (Linear)"] or labels[:2] == ["net[2] (Linear)", "net[0] (Linear)"]


def test_bare_torch_layer_points_at_the_line_that_builds_it(capsys, tmp_path, monkeypatch):
    (finding,) = _check(capsys, tmp_path, monkeypatch, CONV)["findings"]
    assert (finding["location"]["path"], finding["location"]["line"]) == ("model.py", 4)
    assert "related" not in finding
    assert finding["message"].startswith("torch.conv2d in Conv2d overflows")


@pytest.mark.slow
@pytest.mark.subprocess
def test_console_script_is_never_the_location(tmp_path):
    (tmp_path / "model.py").write_text(CONV)
    done = subprocess.run([_console_script(), "check", "model.py", *ARGS[:-1], "concise"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[0].startswith("model.py:4:1: PCL101"), done.stdout
    assert "bin/preclint" not in done.stdout and sys.executable not in done.stdout


def test_probe_ledger_names_an_entry_as_findings_do():
    import torch
    from torch import nn

    from preclint.probe.ledger import ProbeResult, node_row
    from tests.helpers import check

    _, graph, ctx = check(nn.Sequential(nn.Linear(8, 8), nn.GELU()), (torch.randn(2, 8),), precisions=("bf16",))
    row = node_row(graph, ctx, ProbeResult(environment={}, modes={}, order=[]), "_0")
    assert row["label"] == "model[0] (Linear)" and row["module"] == "0"
