"""The gitlab (Code Quality) and junit formats, validated against what their consumers read, and the
fingerprints that SARIF, GitLab and the baseline share: they survive lines inserted above a finding."""
from __future__ import annotations

import json
from xml.etree import ElementTree

import jsonschema
import pytest
import xmlschema

from benchmarks.fuzz.oracle import document_problem
from preclint.cli import main
from preclint.core.findings import ErrorFigure, Finding, Location
from preclint.report import Report, render, render_reports
from preclint.report.fingerprint import SARIF_KEY, content_fingerprint, stable_fingerprints
from tests.helpers import finding
from tests.paths import DATA

GITLAB_SCHEMA = json.loads((DATA / "gitlab-codequality.schema.json").read_text())
JUNIT_SCHEMA = xmlschema.XMLSchema(str(DATA / "junit-10.xsd"))
AMP = "with torch.cuda.amp.autocast():\n    y = model(x)\n"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CI_PROJECT_DIR", raising=False)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import torch\n" + AMP + AMP)
    (tmp_path / "net.py").write_text("import torch\n")
    return tmp_path


def gitlab(reports) -> list:
    text = render_reports(reports, "gitlab")
    assert document_problem("gitlab", text) is None  # the fuzzer's oracle reads it as GitLab would
    issues = json.loads(text)
    jsonschema.validate(issues, GITLAB_SCHEMA)
    assert len({issue["fingerprint"] for issue in issues}) == len(issues)  # GitLab shows one per fingerprint
    return issues


def junit(reports) -> ElementTree.Element:
    text = render_reports(reports, "junit")
    JUNIT_SCHEMA.validate(text)
    assert document_problem("junit", text) is None
    return ElementTree.fromstring(text)


def refuted(**kw) -> Finding:
    f = finding("PCL103", line=4, column=1, severity="warning", message="bn multiplies the error by 40.", **kw)
    f.measured = {"fp16": ErrorFigure(3e-4, 3e-4, status="refuted")}
    f.status = "refuted"
    return f


# ---- gitlab ------------------------------------------------------------------------------------------

def test_gitlab_issues_carry_the_fields_gitlab_reads(files):
    library = Finding("PCL101", "fp16-overflow", "error", "conv overflows float16.", "Scale it.",
                      location=Location("torchvision/models/resnet.py", 92, 1, library=True), module="conv",
                      op="nn.Conv2d", related=((Location("net.py", 1, 1), "the call"),))
    model_level = Finding("PCL001", "output-tolerance", "info", "The output misses rtol=1e-3.", "Loosen it.")
    report = Report(findings=[finding(line=2), finding(line=4), library, model_level, refuted()],
                    model="net.py:Net", caveats=["the output is constant: every check is vacuous"])
    issues = gitlab([report, Report(model="gone.py", error="no such file")])
    by_line = {(i["check_name"], i["location"]["path"], i["location"]["lines"]["begin"]): i for i in issues}
    amp = by_line[("PCL502", "pkg/m.py", 2)]
    assert amp["description"] == "It is deprecated." and amp["severity"] == "minor"
    assert ("PCL502", "pkg/m.py", 4) in by_line  # the same line twice: two issues, two fingerprints
    moved = by_line[("PCL101", "net.py", 1)]  # on the user's line, naming the library's
    assert moved["severity"] == "major" and "[at torchvision/models/resnet.py:92, library code]" in moved["description"]
    assert by_line[("PCL001", "net.py", 1)]["severity"] == "info"  # model-level: line 1 of the model's file
    assert all(i["check_name"] != "PCL103" for i in issues)  # refuted by the probe: not an issue
    assert by_line[("preclint/caveat", "net.py", 1)]["description"].startswith("the output is constant")
    failed = by_line[("preclint/model-not-checked", "gone.py", 1)]
    assert failed["severity"] == "blocker" and "could not check gone.py: no such file" in failed["description"]
    assert render_reports([report], "gitlab") == render_reports([report], "gitlab")  # same bytes


def test_gitlab_paths_are_relative_to_the_checkout_when_the_job_runs_below_it(files, monkeypatch):
    (files / "pkg" / "sub").mkdir()
    monkeypatch.chdir(files / "pkg")
    monkeypatch.setenv("CI_PROJECT_DIR", str(files))
    (issue,) = gitlab([Report(findings=[finding(path="m.py", line=2)])])
    assert issue["location"]["path"] == "pkg/m.py"
    monkeypatch.setenv("CI_PROJECT_DIR", str(files / "pkg" / "sub"))  # not below it: as printed
    (issue,) = gitlab([Report(findings=[finding(path="m.py", line=2)])])
    assert issue["location"]["path"] == "m.py"


def test_gitlab_of_a_clean_run_is_an_empty_list(files):
    assert gitlab([Report(files=["net.py"])]) == []


# ---- junit -------------------------------------------------------------------------------------------

def test_junit_has_a_test_case_per_file_and_a_failure_per_finding(files):
    report = Report(findings=[finding(line=2), finding(line=4, fixable=True), refuted()],
                    files=["net.py", "pkg/m.py"])
    root = junit([report])
    (suite,) = root.findall("testsuite")
    assert root.get("name") == suite.get("name") == "preclint"
    cases = {case.get("name"): case for case in suite.findall("testcase")}
    assert set(cases) == {"net.py", "pkg/m.py"} and suite.get("tests") == "2"
    assert cases["net.py"].find("failure") is None  # checked, clean: a passing test case
    failures = cases["pkg/m.py"].findall("failure")
    assert [f.get("type") for f in failures] == ["PCL502", "PCL502"]
    assert failures[0].get("message") == "PCL502 It is deprecated."
    assert failures[1].text == "pkg/m.py:4:6: PCL502 [*] It is deprecated.\nhelp: Use the new one."
    out = cases["pkg/m.py"].find("system-out").text.splitlines()  # all of them, for one-failure readers
    assert out[:2] == ["pkg/m.py:2:6: PCL502 It is deprecated.", "pkg/m.py:4:6: PCL502 [*] It is deprecated."]
    assert out[2].endswith("(refuted by the probe)")  # listed, not a failure
    assert (suite.get("failures"), suite.get("errors")) == ("1", "0")  # test cases, as JUnit counts
    assert suite.find("properties/property").attrib == {"name": "findings", "value": "2"}


def test_junit_has_a_test_case_per_model_and_an_error_for_one_not_checked(files):
    ok = Report(findings=[finding(line=2)], model="net.py:Net")
    root = junit([ok, Report(model="gone.py", error="no such file")])
    cases = root.findall("testsuite/testcase")
    assert [(c.get("name"), c.get("classname")) for c in cases] == [("net.py:Net", "preclint.model"),
                                                                    ("gone.py", "preclint.model")]
    assert cases[1].find("error").get("message") == "preclint could not check gone.py: no such file"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("2", "1", "1")


def test_junit_carries_names_xml_cannot_hold(files):
    # control characters, a lone surrogate (a name that is not UTF-8) and U+FFFE: none of them may
    # appear in an XML 1.0 document, not even as a character reference
    name = "a\x01b\x1b[31m\udcff\ufffe\u202e.py"
    text = render(Report(findings=[finding(path=name, message=f"{name} is deprecated.")], files=[name]), "junit")
    text.encode("utf-8")  # writable as it is
    JUNIT_SCHEMA.validate(text)
    case = ElementTree.fromstring(text).find("testsuite/testcase")
    shown = "a\\x01b\\x1b[31m\\xff\\ufffe\\u202e.py"
    assert case.get("name") == shown and case.find("failure").get("message") == f"PCL502 {shown} is deprecated."


# ---- fingerprints ------------------------------------------------------------------------------------

def test_fingerprints_are_unique_and_do_not_depend_on_the_line_number(files):
    twice = [finding(line=4), finding(line=2)]
    first = stable_fingerprints(twice)
    assert len(set(first)) == 2
    (files / "pkg" / "m.py").write_text("import torch\n\n\n# moved\n" + AMP + AMP)
    assert stable_fingerprints([finding(line=5), finding(line=7)]) == first[::-1]  # in sorted order
    assert content_fingerprint(finding(line=5)) == content_fingerprint(finding(line=7))


def _fingerprints_of_a_run(capsys, fmt: str) -> dict:
    assert main(["check", "--source-only", "--no-cache", ".", "--output-format", fmt]) == 1
    out = capsys.readouterr().out
    if fmt == "sarif":
        return {(r["locations"][0]["physicalLocation"]["region"]["startLine"]): r["partialFingerprints"][SARIF_KEY]
                for r in json.loads(out)["runs"][0]["results"]}
    return {i["location"]["lines"]["begin"]: i["fingerprint"] for i in json.loads(out)}


@pytest.mark.parametrize("fmt", ["sarif", "gitlab"])
def test_inserting_lines_above_a_finding_keeps_its_fingerprint(files, capsys, fmt):
    before = _fingerprints_of_a_run(capsys, fmt)
    assert sorted(before) == [2, 4]
    source = files / "pkg" / "m.py"
    source.write_text("import torch\nimport os\n\n\ndef unrelated():\n        return 1\n" + AMP + "\n" + AMP)
    after = _fingerprints_of_a_run(capsys, fmt)
    assert sorted(after) == [7, 10] and [after[7], after[10]] == [before[2], before[4]]
    source.write_text("import torch\nwith torch.cuda.amp.autocast(enabled=True):\n    y = model(x)\n" + AMP)
    edited = _fingerprints_of_a_run(capsys, fmt)
    assert edited[2] not in before.values()  # the flagged line itself changed: a new finding
    assert edited[4] == before[2]  # the one left is the first of its kind now (GitLab: 1 fixed, 1 new)


def test_the_baseline_and_gitlab_agree_after_lines_move(files, capsys):
    assert main(["check", "--source-only", "--no-cache", ".", "--write-baseline", "base.json"]) == 0
    records = json.loads((files / "base.json").read_text())["findings"]
    (files / "pkg" / "m.py").write_text("import torch\n\n\n" + AMP + AMP + AMP)  # moved, and one more
    capsys.readouterr()
    code = main(["check", "--source-only", "--no-cache", ".", "--baseline", "base.json", "--output-format", "concise"])
    out = capsys.readouterr().out
    assert code == 1 and out.startswith("pkg/m.py:8:6: PCL502") and "Found 1 finding." in out  # only the new one
    assert records[0]["fingerprint"] == content_fingerprint(finding(line=4)) and records[0]["count"] == 2


def test_a_baseline_written_before_the_shared_fingerprint_still_matches(tmp_path, monkeypatch, capsys):
    # written by preclint 0.1.0 before report.fingerprint existed, for this file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text("import torch\n\n" + AMP)
    (tmp_path / "base.json").write_text(json.dumps({"format": "preclint-baseline", "version": 1, "findings": [
        {"path": "net.py", "code": "PCL502", "fingerprint": "d47e82a8c0b3795c", "count": 1,
         "text": "with torch.cuda.amp.autocast():"}]}))
    code = main(["check", "--source-only", "--no-cache", "net.py", "--baseline", "base.json", "--output-format", "concise"])
    assert code == 0, capsys.readouterr()
