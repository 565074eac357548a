"""concise, sarif, github and rdjson renderers: shapes, escaping, caps, schema, determinism."""
from __future__ import annotations

import json

import jsonschema
import pytest

from preclint.core.findings import ErrorFigure, Finding, Location
from preclint.report import Report, render
from preclint.text.lines import _line_hashes
from tests.helpers import finding
from tests.paths import DATA

SCHEMA = DATA / "sarif-schema-2.1.0.json"


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("import torch\nwith torch.cuda.amp.autocast():\n    y = 'a𐐀b'\n")
    return tmp_path


def graph_finding():
    return Finding(
        "PCL101", "fp16-overflow", "error", "layer1.0.conv2 overflows fp16.", "Scale the input.",
        location=Location("pkg/m.py", 3, 5), precisions=("fp16",), module="layer1.0.conv2", op="conv2d",
        predicted={"fp16": ErrorFigure(rel_error=float("inf"), max_abs_error=2.5)},
        related=((Location("pkg/m.py", 2, 1), "built here"),),
    )


def model_level():
    return Finding("PCL001", "output-tolerance", "warning", "The output misses rtol=1e-3.", "Loosen it.")


def test_concise(files):
    report = Report(findings=[finding(fixable=True), model_level(), finding("PCL504", 1, 1)], model="pkg/m.py")
    assert render(report, "concise") == (
        "pkg/m.py: PCL001 The output misses rtol=1e-3.\n"
        "pkg/m.py:1:1: PCL504 It is deprecated.\n"
        "pkg/m.py:2:6: PCL502 [*] It is deprecated.\n"
        "Found 3 findings.\n"
        "[*] 1 fixable with the `--fix` option.\n"
    )
    assert render(Report(), "concise") == "All checks passed!\n"


def test_sarif_validates_and_carries_what_github_needs(files):
    report = Report(findings=[finding(fixable=True), graph_finding(), model_level()])
    document = json.loads(render(report, "sarif"))
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    assert document["version"] == "2.1.0"
    run = document["runs"][0]
    assert run["columnKind"] == "unicodeCodePoints"
    rules = run["tool"]["driver"]["rules"]
    ids = [r["id"] for r in rules]
    assert ids == sorted(ids) and {"PCL500", "PCL501", "PCL502", "PCL503", "PCL504", "PCL505", "PCL599"} <= set(ids)
    for rule in rules:
        assert rule["shortDescription"]["text"] and rule["fullDescription"]["text"] and rule["help"]["text"]
        assert len(rule["fullDescription"]["text"]) <= 1024 and rule["help"]["markdown"].startswith("# ")
        assert rule["defaultConfiguration"]["level"] in ("note", "warning", "error")
    by_rule = {r["ruleId"]: r for r in run["results"]}
    amp = by_rule["PCL502"]
    assert ids[amp["ruleIndex"]] == "PCL502" and amp["level"] == "warning"
    assert amp["message"]["text"] == "It is deprecated.\nhelp: Use the new one."
    location = amp["locations"][0]["physicalLocation"]
    assert location["artifactLocation"] == {"uri": "pkg/m.py", "uriBaseId": "%SRCROOT%"}
    assert location["region"] == {"startLine": 2, "startColumn": 6, "endLine": 2, "endColumn": 32}
    assert amp["partialFingerprints"]["primaryLocationLineHash"] == _line_hashes(
        (files / "pkg" / "m.py").read_text())[2]
    overflow = by_rule["PCL101"]
    assert overflow["level"] == "error" and overflow["properties"]["module"] == "layer1.0.conv2"
    assert overflow["properties"]["predicted"]["fp16"]["rel_error"] is None  # inf is not JSON
    assert overflow["relatedLocations"][0]["message"]["text"] == "built here"
    assert "locations" not in by_rule["PCL001"]  # model-level: valid SARIF without a location


# github/codeql-action's own test vectors (src/fingerprints.test.ts)
@pytest.mark.parametrize(
    "text, expected",
    [
        ("", ["c129715d7a2bc9a3:1"]),
        (" a\nb\n  \t\tc\n d", ["271789c17abda88f:1", "54703d4cd895b18:1", "180aee12dab6264:1", "a23a3dc5e078b07b:1"]),
        (
            " hello; \t\nworld!!!\r\n\n\r  \t\tGreetings\r End\r\n",
            ["e9496ae3ebfced30:1", "fb7c023a8b9ccb3f:1", "ce8ba1a563dcdaca:1", "e20e36e16fcb0cc8:1",
             "b3edc88f2938467e:1", "c8e28b0b4002a3a0:1", "c129715d7a2bc9a3:1"],
        ),
        (
            "Lorem ipsum dolor sit amet.\n" * 10,
            ["a7f2ff13bc495cf2:1", "a7f2ff13bc495cf2:2", "a7f2ff13bc495cf2:3", "a7f2ff13bc495cf2:4",
             "a7f2ff13bc495cf2:5", "a7f2ff13bc495cf2:6", "a7f2ff1481e87703:1", "a9cf91f7bbf1862b:1",
             "55ec222b86bcae53:1", "cc97dc7b1d7d8f7b:1", "c129715d7a2bc9a3:1"],
        ),
    ],
)
def test_line_hash_matches_github(text, expected):
    hashes = _line_hashes(text)
    assert [hashes[i + 1] for i in range(len(expected))] == expected


def test_github_annotation_and_escaping(files):
    odd = finding(path="dir,with:odd/m%.py", message="50% of it\nbreaks", fix="Fix: this, now.")
    out = render(Report(findings=[odd, model_level()]), "github").splitlines()
    assert out[0] == "::warning title=preclint (PCL001)::-: PCL001 The output misses rtol=1e-3.%0A  help: Loosen it."
    assert out[1] == (
        "::warning file=dir%2Cwith%3Aodd/m%25.py,line=2,col=6,title=preclint (PCL502)::"
        # a line break in a message is shown, as \n (it may be a name's: report.escape)
        "dir,with:odd/m%25.py:2:6: PCL502 50%25 of it\\nbreaks%0A  help: Fix: this, now."
    )


def test_github_caps_annotations_per_level_with_one_summary(files):
    findings = (
        [finding(line=i, severity="warning") for i in range(1, 26)]
        + [finding("PCL599", line=i, severity="error") for i in range(1, 4)]
        + [finding("PCL500", line=i, severity="info") for i in range(1, 13)]
    )
    out = render(Report(findings=findings), "github").splitlines()
    assert sum(line.startswith("::error ") for line in out) == 3
    assert sum(line.startswith("::warning ") for line in out) == 10
    assert sum(line.startswith("::notice ") for line in out) == 10  # 9 findings and the summary
    assert out[-1].startswith("::notice title=preclint::18 more findings not shown as annotations")
    plain = [line for line in out if not line.startswith("::")]
    assert len(plain) == 18 and all(line.startswith("pkg/m.py:") for line in plain)
    assert out[0].startswith("::error ")  # most severe first


def test_rdjson_counts_columns_in_utf8_bytes(files):
    document = json.loads(render(Report(findings=[finding(line=3, column=12), model_level()]), "rdjson"))
    assert document["source"] == {"name": "preclint"}
    located, model = sorted(document["diagnostics"], key=lambda d: "location" in d)[::-1]
    # line 3 is "    y = 'a𐐀b'": code point 12 is 'b', after a four-byte character
    assert located["location"] == {"path": "pkg/m.py", "range": {"start": {"line": 3, "column": 15}}}
    assert located["severity"] == "WARNING" and located["code"] == {"value": "PCL502"}
    assert "location" not in model and model["message"].startswith("The output misses")


def test_every_format_is_deterministic(files):
    findings = [graph_finding(), finding(), model_level(), finding("PCL504", 1, 1)]
    for fmt in ("concise", "sarif", "github", "rdjson"):
        first = render(Report(findings=list(findings)), fmt)
        assert render(Report(findings=list(reversed(findings))), fmt) == first


def test_several_models_make_one_document_in_every_format(files):
    """Two models checked and one that could not be: each format prints one output holding all three."""
    from preclint.report import render_reports

    reports = [Report(findings=[graph_finding()], model="a.py:Net"), Report(findings=[finding()], model="b.py:Net"),
               Report(model="c.py", error="c.py: no nn.Module found")]
    docs = json.loads(render_reports(reports, "json"))
    assert [d["model"] for d in docs] == ["a.py:Net", "b.py:Net", "c.py"]
    assert docs[2]["error"] == "c.py: no nn.Module found" and "error" not in docs[0]
    sarif = json.loads(render_reports(reports, "sarif"))
    jsonschema.validate(sarif, json.loads(SCHEMA.read_text()))
    (run,) = sarif["runs"]
    assert [r["ruleId"] for r in run["results"]] == ["PCL502", "PCL101"]  # sorted over the models: m.py:2, m.py:3
    assert run["invocations"] == [{"executionSuccessful": False, "toolExecutionNotifications": [
        {"level": "error", "message": {"text": "preclint could not check c.py: c.py: no nn.Module found"},
         "descriptor": {"id": "model-not-checked"}}]}]
    assert json.loads(render(reports[0], "sarif"))["runs"][0]["invocations"] == [{"executionSuccessful": True}]
    rdjson = json.loads(render_reports(reports, "rdjson"))
    assert [d["severity"] for d in rdjson["diagnostics"]] == ["WARNING", "ERROR", "ERROR"]
    assert rdjson["diagnostics"][-1]["message"] == "preclint could not check c.py: c.py: no nn.Module found"
    github = render_reports(reports, "github").splitlines()
    assert github[0] == "::error title=preclint::preclint could not check c.py: c.py: no nn.Module found"
    assert len(github) == 3
    assert render_reports(reports, "concise").splitlines()[-2:] == ["Found 2 findings.", "1 model could not be checked: c.py."]
    assert render_reports(reports[2:] + reports[2:] + [Report(model="d.py")], "concise") == \
        "2 models could not be checked: c.py, c.py.\n"  # not "All checks passed!"
    full = render_reports(reports, "full")
    assert full.count("preclint a.py:Net") == 1 and full.endswith("1 model could not be checked: c.py.\n")
    for fmt in ("full", "concise"):  # nothing was checked: the error on stderr is the whole story
        assert render_reports(reports[2:], fmt) == ""
