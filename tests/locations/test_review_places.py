"""Where each format puts a finding whose op lives in a library's file, and how refuted findings show.

Code review (SARIF, GitHub annotations, reviewdog) can only annotate the project's files: a finding
made in ``torchvision/models/resnet.py`` goes on the user's line that reaches it, with the library's
line carried along. Findings the probe refuted are marked and never fail the build.
"""
import json

import jsonschema

from preclint.core.exitcodes import exit_code
from preclint.core.findings import ErrorFigure, Finding, Location
from preclint.report import Report, render, review_place
from tests.paths import DATA

SCHEMA = DATA / "sarif-schema-2.1.0.json"
LIBRARY = Location("torchvision/models/resnet.py", 92, 1, library=True)
CALL = Location("model.py", 12, 1)
BUILT = Location("model.py", 8, 1)


def library_finding(**kw) -> Finding:
    return Finding("PCL101", "fp16-overflow", kw.pop("severity", "error"), "block.conv1 overflows float16.",
                   "Scale the input down.", location=LIBRARY, precisions=("fp16",), module="block.conv1",
                   op="nn.Conv2d", node="block_conv1",
                   related=((CALL, "the call into torchvision that reaches block.conv1"),
                            (BUILT, "block.conv1 is built here")), **kw)


def refuted_finding() -> Finding:
    f = Finding("PCL103", "batchnorm-scale", "warning", "bn multiplies the error by 40.", "Fold it.",
                location=Location("model.py", 20, 9), precisions=("fp16",), module="bn", op="nn.BatchNorm2d")
    f.predicted = {"fp16": ErrorFigure(1e-2, 1e-2)}
    f.measured = {"fp16": ErrorFigure(3e-4, 3e-4, status="refuted")}
    f.status = "refuted"
    return f


def report(*findings) -> Report:
    return Report(findings=list(findings), model="model.py:Net", capture="fx", precisions=("fp16",))


def test_review_place_moves_a_library_finding_to_the_users_line():
    primary, related = review_place(library_finding())
    assert primary == CALL
    assert related[0][0] == LIBRARY and "library code" in related[0][1]
    assert [loc for loc, _ in related[1:]] == [BUILT]
    # a finding already in the project stays where it is
    own = Finding("PCL101", "n", "error", "m", "f", location=CALL)
    assert review_place(own) == (CALL, [])


def test_sarif_annotates_the_users_line_and_relates_the_library_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("\n" * 20)
    document = json.loads(render(report(library_finding()), "sarif"))
    jsonschema.validate(document, json.loads(SCHEMA.read_text()))
    run = document["runs"][0]
    result = run["results"][0]
    (location,) = result["locations"]
    assert location["physicalLocation"]["artifactLocation"] == {"uri": "model.py", "uriBaseId": "%SRCROOT%"}
    assert location["physicalLocation"]["region"]["startLine"] == CALL.line
    library = result["relatedLocations"][0]["physicalLocation"]
    assert library["artifactLocation"] == {"uri": "torchvision/models/resnet.py", "uriBaseId": "PYTHONPATH"}
    assert library["region"]["startLine"] == 92
    assert "PYTHONPATH" in run["originalUriBaseIds"]
    assert "torchvision/models/resnet.py:92" in result["message"]["text"]


def test_github_annotation_goes_on_the_users_line_and_names_the_library_line():
    out = render(report(library_finding()), "github")
    (line,) = out.splitlines()[:1]
    assert line.startswith("::error file=model.py,line=12,col=1,")
    assert "torchvision/models/resnet.py:92, library code" in line


def test_a_library_finding_with_no_place_in_the_project_is_a_general_annotation():
    f = library_finding()
    f.related = ()
    line = render(report(f), "github").splitlines()[0]
    assert line.startswith("::error title=") and "file=" not in line.split("::")[1]
    assert "torchvision/models/resnet.py:92" in line
    sarif = json.loads(render(report(f), "sarif"))["runs"][0]["results"][0]
    assert "locations" not in sarif and sarif["relatedLocations"][0]["physicalLocation"]["artifactLocation"]["uri"] \
        == "torchvision/models/resnet.py"


def test_rdjson_places_the_finding_in_the_project_with_related_locations():
    diagnostic = json.loads(render(report(library_finding()), "rdjson"))["diagnostics"][0]
    assert diagnostic["location"]["path"] == "model.py"
    assert [r["location"]["path"] for r in diagnostic["related_locations"]] == ["model.py"]
    assert "torchvision/models/resnet.py:92" in diagnostic["message"]


def test_json_and_concise_keep_the_library_location():
    doc = json.loads(render(report(library_finding()), "json"))
    assert doc["findings"][0]["location"] == {"path": "torchvision/models/resnet.py", "line": 92, "column": 1,
                                              "library": True}
    assert doc["findings"][0]["related"][0]["path"] == "model.py"
    assert render(report(library_finding()), "concise").startswith("torchvision/models/resnet.py:92:1: PCL101")


def test_refuted_findings_are_marked_and_do_not_fail_the_build():
    standing = library_finding(severity="warning")
    refuted = refuted_finding()
    assert exit_code([refuted], "warning", False) == 0
    assert exit_code([refuted, standing], "warning", False) == 1
    concise = render(report(refuted), "concise")
    assert "(refuted by the probe)" in concise and "1 refuted by the probe" in concise
    assert "refuted by the probe" in render(report(refuted), "full")
    sarif = json.loads(render(report(refuted), "sarif"))["runs"][0]["results"][0]
    assert sarif["kind"] == "pass" and sarif["level"] == "none"  # SARIF: any kind but fail has level none
    assert sarif["properties"]["status"] == "refuted" and sarif["message"]["text"].startswith("Refuted by the probe")
    github = render(report(refuted, standing), "github").splitlines()
    annotations = [line for line in github if line.startswith("::")]
    assert len(annotations) == 1 and "PCL101" in annotations[0]  # the refuted one is a log line, not an annotation
    assert any(line.startswith("model.py:20:9: PCL103") and line.endswith("(refuted by the probe)") for line in github)
    assert json.loads(render(report(refuted), "rdjson"))["diagnostics"][0]["severity"] == "INFO"


def test_a_file_name_with_a_colon_is_the_projects_and_is_annotated(tmp_path, monkeypatch, capsys):
    """Only an absolute path on another Windows drive (``D:/...``) is outside the project: a name with
    a ``:`` near its start (``a:b.py``) is a file of the project, annotated on its line."""
    from preclint.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "a:b.py").write_text("import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n")
    assert main(["check", "--source-only", "a:b.py", "--output-format", "github"]) == 1
    assert capsys.readouterr().out.startswith("::warning file=a%3Ab.py,line=3,col=6,title=preclint (PCL502)::a:b.py:3:6:")
    assert Location("a:b.py").in_project and Location("::x.py").in_project
    assert not Location("D:/work/m.py").in_project and not Location("../m.py").in_project
