"""Suppression comments: the forms honoured, unused ones reported, graph findings included."""
from __future__ import annotations

import os

from preclint.core.findings import Finding, Location
from preclint.source.run import check_text
from preclint.source.suppress import apply_suppressions, parse_directives

BAD = "import torch\nscaler = torch.cuda.amp.GradScaler()"


def codes(text, path="pkg/m.py"):
    return [f.code for f in check_text(text, path)]


def test_forms_that_silence_a_finding():
    assert codes(BAD + "\n") == ["PCL502"]
    for comment in (
        "# preclint: ignore[PCL502]",
        "# preclint: ignore[deprecated-amp-api]",
        "# preclint: ignore",
        "# noqa: PCL502",
        "# noqa:PCL502,E501",
        "# NOQA: E501 PCL502",
        "# noqa",
        "# type: ignore  # noqa: PCL502",
    ):
        assert codes(f"{BAD}  {comment}\n") == [], comment


def test_forms_that_do_not_silence():
    assert codes(f"{BAD}  # noqa: E501\n") == ["PCL502"]  # another tool's code
    assert codes(f"{BAD}  # preclint: ignore[PCL501]\n") == ["PCL502", "PCL500"]
    assert codes(f"{BAD}\n# noqa: PCL502\n") == ["PCL502", "PCL500"]  # on another line
    assert codes(f'{BAD}\ns = "# noqa: PCL502"\n') == ["PCL502"]  # inside a string
    # a code that names no rule (a typo) silences nothing: it is no blanket ignore
    assert codes(f"{BAD}  # preclint: ignore[PCL599]\n") == ["PCL502", "PCL500"]
    assert codes(f"{BAD}  # preclint: ignore[deprecated-amp-apii]\n") == ["PCL502", "PCL500"]


def test_unused_suppressions_are_pcl500():
    findings = check_text("import torch\nx = torch.ones(3)  # noqa: PCL501, PCL777\n", "pkg/m.py")
    (finding,) = findings
    assert finding.code == "PCL500" and finding.severity == "info"
    assert finding.location == Location("pkg/m.py", 2, 20)
    assert "PCL501" in finding.message and "PCL777" in finding.message


def test_unused_is_judged_only_for_codes_that_ran():
    # a graph code in a source-only run, a bare noqa, and PCL500 itself are never called unused
    assert codes("x = 1  # noqa: PCL101\n") == []
    assert codes("x = 1  # noqa\n") == []
    assert codes("x = 1  # noqa: PCL501, PCL500\n") == []


def test_directives_parse_codes_and_names():
    directives = parse_directives("a = 1  # preclint: ignore[PCL501, fp16-epsilon-literal]\nb = 2  # noqa: E501\n")
    (directive,) = directives[1]
    assert directive.codes == ("PCL501", "PCL505")
    assert 2 not in directives


def test_graph_findings_are_suppressed_on_their_line_or_the_defining_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(
        "class Net:\n"
        "    def __init__(self):\n"
        "        self.conv = Conv()  # preclint: ignore[PCL101]\n"
        "    def forward(self, x):\n"
        "        return self.conv(x)  # noqa: PCL205\n"
    )

    def finding(code, line, related_line=None):
        related = ((Location("model.py", related_line, 9), "built here"),) if related_line else ()
        return Finding(code, "n", "warning", "m", "f", location=Location("model.py", line, 16), related=related)

    findings = [finding("PCL101", 5, 3), finding("PCL205", 5), finding("PCL103", 5, 3)]
    kept = apply_suppressions(findings, report_unused=True, checked_codes=["PCL101", "PCL103", "PCL205"])
    assert [f.code for f in kept] == ["PCL103"]


def test_unused_graph_suppression_in_a_model_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("y = conv(x)  # noqa: PCL101\n")
    kept = apply_suppressions([], True, checked_codes=["PCL101"], files=["model.py"])
    assert [(f.code, f.location.line) for f in kept] == [("PCL500", 1)]
    assert apply_suppressions([], False, checked_codes=["PCL101"], files=["model.py"]) == []
    assert os.path.exists("model.py")
