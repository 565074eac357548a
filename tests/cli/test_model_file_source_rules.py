"""``preclint check model.py`` runs the source rules on model.py too (they read it, never run it):
what ``--source-only`` finds there (a deprecated ``torch.cuda.amp``, a tolerance too tight for fp16)
comes with the graph findings, once, with the same suppression comments and baseline."""
import json
import textwrap

import pytest

from preclint.cli import main

MODEL = textwrap.dedent("""\
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x):
            with torch.cuda.amp.autocast(enabled=False):
                return self.fc(x)


    model = Net()
    example_inputs = (torch.randn(2, 16),)


    def test_half_matches():
        out = model(*example_inputs)
        assert torch.allclose(out.half().float(), out, rtol=1e-7, atol=0)
    """)
AMP_LINE, ALLCLOSE_LINE = 11, 21


def _run(capsys, *args):
    code = main(["check", *args, "--output-format", "json"])
    return code, json.loads(capsys.readouterr().out)


def _places(doc):
    return sorted((f["code"], f["location"]["path"], f["location"]["line"], f["location"]["column"], f["message"])
                  for f in doc["findings"])


@pytest.fixture()
def project(tmp_path, monkeypatch):
    (tmp_path / "model.py").write_text(MODEL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_check_reports_what_source_only_finds_in_the_model_file(capsys, project):
    code, checked = _run(capsys, "model.py", "--precision", "fp16")
    _, source_only = _run(capsys, "model.py", "--source-only")
    assert code == 1
    assert {(c, line) for c, _, line, _, _ in _places(checked)} == {("PCL502", AMP_LINE), ("PCL501", ALLCLOSE_LINE)}
    assert _places(checked) == _places(source_only)


def test_one_suppression_pass_for_graph_and_source_findings(capsys, project):
    lines = MODEL.splitlines()
    lines[AMP_LINE - 1] += "  # preclint: ignore[PCL502]"
    lines[ALLCLOSE_LINE - 1] += "  # preclint: ignore[PCL501, PCL777]"
    (project / "model.py").write_text("\n".join(lines) + "\n")
    _, checked = _run(capsys, "model.py", "--precision", "fp16")
    # the unknown code is reported once, not by the source rules and again by the graph check
    assert [(f["code"], f["location"]["line"]) for f in checked["findings"]] == [("PCL500", ALLCLOSE_LINE)]
    _, source_only = _run(capsys, "model.py", "--source-only")
    assert _places(checked) == _places(source_only)


def test_baseline_of_the_check_holds_the_source_findings(capsys, project):
    assert main(["check", "model.py", "--precision", "fp16", "--write-baseline", "baseline.json",
                 "--output-format", "json"]) == 0
    capsys.readouterr()
    codes = {record["code"] for record in json.loads((project / "baseline.json").read_text())["findings"]}
    assert {"PCL501", "PCL502"} <= codes
    code, doc = _run(capsys, "model.py", "--precision", "fp16", "--baseline", "baseline.json")
    assert code == 0 and doc["findings"] == []


def test_two_models_of_one_file_report_its_source_findings_once(capsys, project):
    code = main(["check", "model.py", "model.py:Net", "--precision", "fp16", "--output-format", "concise"])
    out = capsys.readouterr().out
    assert code == 1
    assert out.count("PCL502") == 1 and out.count("PCL501") == 1, out


def test_ignoring_the_source_codes_leaves_the_graph_check_as_it_was(capsys, project):
    code, doc = _run(capsys, "model.py", "--precision", "fp16", "--ignore", "PCL5")
    assert code == 0 and doc["findings"] == []
