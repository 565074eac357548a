"""--output-format junit: JUnit XML, for the CI systems that show test reports (Jenkins, GitLab's
``artifacts: reports: junit``, Azure Pipelines' PublishTestResults, CircleCI's store_test_results).

One ``<testsuites name="preclint">`` holding one ``<testsuite name="preclint">``, valid under the JUnit
schema of Jenkins's xUnit plugin (the tests check it). A test case is what preclint checked: each
file of a source check (``classname="preclint.source"``; the files without findings pass, so the
report also says what was checked), each model of a graph check (``classname="preclint.model"``).
Every finding is a ``<failure>`` of its test case: ``type`` the rule code, ``message`` its one-line
message, and as text the finding as the concise format prints it with its fix. Several consumers
show only the first failure of a test case (Jenkins's summary, GitLab's widget), so a test case with
more than one also lists them all in its ``<system-out>``. A finding the probe refuted is no failure:
it is listed in ``<system-out>``, as are the caveats of a vacuous check. A model that could not be
checked is an ``<error>``. Counts follow JUnit: ``failures`` and ``errors`` count test cases; the
number of findings is the suite's ``findings`` property. No times and no timestamps: the same input
writes the same bytes.

Names and messages are shown with escapes (report.escape.xml_text): XML 1.0 cannot carry control
characters at all, and a CI page shows the text as it is; ElementTree escapes the markup.
"""
from __future__ import annotations

from typing import Dict, List, Sequence
from xml.etree import ElementTree

from preclint.report.concise import finding_line
from preclint.report.document import Report, failure_line, is_refuted
from preclint.report.escape import xml_text

SUITE = "preclint"


def _failure(finding, model: str) -> ElementTree.Element:
    # escaped first: a line break in a name stays visible, as \n, instead of becoming a space
    message = f"{finding.code} {' '.join(xml_text(finding.message).split())}"
    element = ElementTree.Element("failure", {"type": finding.code, "message": message})
    text = finding_line(finding, model, placed=True)
    if finding.fix:
        text += "\nhelp: " + " ".join(xml_text(finding.fix).split())
    element.text = _lines(text)
    return element


def _lines(text: str) -> str:
    """Several lines of text: each shown with escapes, the line breaks preclint put between them kept."""
    return "\n".join(xml_text(line) for line in text.split("\n"))


def _testcase(name: str, classname: str, findings: list, model: str, notes: Sequence[str] = ()) -> ElementTree.Element:
    case = ElementTree.Element("testcase", {"name": xml_text(name), "classname": classname})
    failing = [f for f in findings if not is_refuted(f)]
    for finding in failing:
        case.append(_failure(finding, model))
    out = [finding_line(f, model, placed=True) for f in failing] if len(failing) > 1 else []
    out += [finding_line(f, model) for f in findings if is_refuted(f)]
    out += [f"warning: {' '.join(xml_text(note).split())}" for note in notes]
    if out:
        ElementTree.SubElement(case, "system-out").text = _lines("\n".join(out))
    return case


def _source_cases(report: Report) -> List[ElementTree.Element]:
    by_file: Dict[str, list] = {path: [] for path in sorted(report.files)}
    for finding in report.sorted_findings():
        by_file.setdefault(finding.location.path if finding.location else "", []).append(finding)
    return [_testcase(path or "(no file)", "preclint.source", findings, "")
            for path, findings in sorted(by_file.items())]


def _cases(report: Report) -> List[ElementTree.Element]:
    if report.error is not None:
        case = ElementTree.Element("testcase", {"name": xml_text(report.model or "model"), "classname": "preclint.model"})
        ElementTree.SubElement(case, "error", {"type": "model-not-checked", "message": xml_text(failure_line(report))})
        return [case]
    if report.model is None:  # a source check: its files
        return _source_cases(report)
    return [_testcase(report.model, "preclint.model", report.sorted_findings(), report.model, report.caveats)]


def render_many(reports: Sequence[Report]) -> str:
    cases = [case for report in reports for case in _cases(report)]
    failures = sum(1 for case in cases if case.find("failure") is not None)
    errors = sum(1 for case in cases if case.find("error") is not None)
    findings = sum(len(case.findall("failure")) for case in cases)
    counts = {"tests": str(len(cases)), "failures": str(failures), "errors": str(errors)}
    root = ElementTree.Element("testsuites", {"name": SUITE, **counts})
    suite = ElementTree.SubElement(root, "testsuite", {"name": SUITE, **counts, "skipped": "0"})
    properties = ElementTree.SubElement(suite, "properties")
    ElementTree.SubElement(properties, "property", {"name": "findings", "value": str(findings)})
    suite.extend(cases)
    ElementTree.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root, encoding="unicode") + "\n"


def render(report: Report) -> str:
    return render_many([report])
