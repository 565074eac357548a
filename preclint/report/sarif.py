"""--output-format sarif: SARIF 2.1.0 as GitHub code scanning ingests it.

Beyond the minimum GitHub asks for: every rule is described (id, name, short and full description,
help in text and Markdown from the rule's docs, default level, tags), URIs are relative to the
working directory with ``uriBaseId`` %SRCROOT% (the repository root when preclint runs there, as in
CI) and percent-encoded as RFC 3986 asks (report.escape.file_uri), regions are given in Unicode code
points (``columnKind``), and each result carries GitHub's own ``primaryLocationLineHash`` so alerts
keep their identity when lines move, beside preclint's own fingerprint (report.fingerprint: the one
GitLab Code Quality and the baseline use), which does not change when the flagged line moves either. Findings without a source location (model-level) are results
without ``locations``, which SARIF allows. Several models make one run whose invocation is not
successful when a model could not be checked. Deterministic: no timestamps, no absolute paths.

A finding whose own line is a library's (a torchvision or transformers op) is placed on the user's
line that calls into the library or builds the model (report.review_place), since code scanning
annotates the repository's files only; the library's line follows among ``relatedLocations``, its
URI relative to the ``PYTHONPATH`` base: the directory on the Python path the library is imported
from. A finding the probe refuted is a result of ``kind`` "pass" (the check ran and the problem was
not there), whose level SARIF then requires to be "none", and it carries ``status`` "refuted".
"""
from __future__ import annotations

import math
from typing import Sequence

from preclint import __version__
from preclint.report.escape import file_uri, json_text
from preclint.report.document import Report, failure_line, is_refuted, merged, moved_note, review_place
from preclint.report.fingerprint import SARIF_KEY, stable_fingerprints
from preclint.text.lines import line_text, primary_location_line_hash
from preclint.rules import all_rules
from preclint.rules.base import SourceRule

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
LEVELS = {"error": "error", "warning": "warning", "info": "note"}
PROBLEM_SEVERITY = {"error": "error", "warning": "warning", "info": "recommendation"}
FAMILIES = {"0": "model", "1": "range", "2": "accuracy", "3": "decisions", "5": "source"}
MAX_DESCRIPTION = 1024  # GitHub's limit on short and full descriptions
LIBRARY_BASE = "PYTHONPATH"  # uriBaseId of a library's files: relative to the sys.path entry that holds them


def _clip(text: str, limit: int = MAX_DESCRIPTION) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(". ", 0, limit - 1)
    return text[: cut + 1] if cut > 0 else text[: limit - 1] + "…"


def _markdown(rule) -> str:
    return (
        f"# {rule.name} ({rule.code})\n\n{rule.summary}\n\n## Why it matters\n\n{rule.why.strip()}\n\n"
        f"## Example\n\n```python\n{rule.example.strip()}\n```\n\n## Fix\n\n{rule.fix.strip()}\n"
    )


def _rule_descriptor(rule) -> dict:
    source = isinstance(rule, type) and issubclass(rule, SourceRule)
    tags = ["precision", FAMILIES.get(rule.code[3:4], "other")] + list(rule.precisions)
    return {
        "id": rule.code,
        "name": rule.name,
        "shortDescription": {"text": _clip(rule.summary)},
        "fullDescription": {"text": _clip(f"{rule.summary} {rule.why}")},
        "help": {"text": rule.documentation(), "markdown": _markdown(rule)},
        "defaultConfiguration": {"level": LEVELS.get(rule.severity, "warning")},
        "properties": {
            "tags": tags[:20],
            # source rules read the code itself; graph rules predict from a model of rounding error
            "precision": "high" if source else "medium",
            "problem.severity": PROBLEM_SEVERITY.get(rule.severity, "warning"),
        },
    }


def _physical(location) -> dict:
    region = {"startLine": location.line, "startColumn": location.column}
    text = None if location.library else line_text(location.path, location.line)
    if text is not None and len(text) + 1 > location.column:
        # to the end of the line: one line, so GitHub can show and match it
        region.update({"endLine": location.line, "endColumn": len(text) + 1})
    base = LIBRARY_BASE if location.library else "%SRCROOT%"
    return {"artifactLocation": {"uri": file_uri(location.path), "uriBaseId": base}, "region": region}


def _number(value):
    return None if value is None or (isinstance(value, float) and not math.isfinite(value)) else value


def _result(finding, rule_index: dict, fingerprint: str) -> dict:
    result = {"ruleId": finding.code}
    if finding.code in rule_index:
        result["ruleIndex"] = rule_index[finding.code]
    if is_refuted(finding):
        result["kind"] = "pass"
        result["level"] = "none"
    else:
        result["level"] = LEVELS.get(finding.severity, "warning")
    primary, related = review_place(finding)
    text = ("Refuted by the probe: " if is_refuted(finding) else "") + " ".join(finding.message.split())
    text += moved_note(finding, primary)
    if finding.fix:
        text += f"\nhelp: {' '.join(finding.fix.split())}"
    result["message"] = {"text": text}
    result["partialFingerprints"] = {SARIF_KEY: fingerprint}
    if primary is not None:
        result["locations"] = [{"physicalLocation": _physical(primary)}]
        line_hash = primary_location_line_hash(primary.path, primary.line)
        if line_hash is not None:
            result["partialFingerprints"]["primaryLocationLineHash"] = line_hash
    if related:
        result["relatedLocations"] = [
            {"id": i, "physicalLocation": _physical(loc), "message": {"text": text}}
            for i, (loc, text) in enumerate(related, 1)
        ]
    properties = {}
    if finding.precisions:
        properties["precisions"] = list(finding.precisions)
    if finding.module:
        properties["module"] = finding.module
    if finding.op:
        properties["op"] = finding.op
    if finding.predicted:
        properties["predicted"] = {
            mode: {k: _number(v) for k, v in fig.as_dict().items()} for mode, fig in sorted(finding.predicted.items())
        }
    if finding.measured:
        properties["measured"] = {
            mode: {k: _number(v) for k, v in fig.as_dict().items()} for mode, fig in sorted(finding.measured.items())
        }
    if finding.status:
        properties["status"] = finding.status
    if finding.fixable:
        properties["fixable"] = True
    if properties:
        result["properties"] = properties
    return result


def to_dict(report: Report) -> dict:
    rules = [rule for _, rule in sorted(all_rules().items())]
    rule_index = {rule.code: i for i, rule in enumerate(rules)}
    findings = report.sorted_findings()
    run = {
        "tool": {
            "driver": {
                "name": "preclint",
                "version": __version__,
                "semanticVersion": __version__,
                "rules": [_rule_descriptor(rule) for rule in rules],
            }
        },
        "columnKind": "unicodeCodePoints",
        "results": [_result(f, rule_index, fingerprint) for f, fingerprint in zip(findings, stable_fingerprints(findings))],
    }
    if report.caveats:  # a vacuous check (a degenerate output) is a fact about the run, not a result
        run["invocations"] = [{"executionSuccessful": True, "toolExecutionNotifications": [
            {"level": "warning", "message": {"text": caveat}} for caveat in report.caveats]}]
    if any(loc.library for f in report.findings for loc in [f.location] + [loc for loc, _ in f.related] if loc):
        run["originalUriBaseIds"] = {LIBRARY_BASE: {"description": {
            "text": "The directory on the Python path (sys.path) that an installed library is imported from."}}}
    return {"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}


def render(report: Report) -> str:
    return json_text(to_dict(report), indent=2, allow_nan=False) + "\n"


def render_many(reports: Sequence[Report]) -> str:
    """One run for every model (GitHub takes one run per tool and category) and one invocation: not
    successful when a model could not be checked, each such model a tool execution notification."""
    document = to_dict(merged(reports))
    (run,) = document["runs"]
    invocation = run.setdefault("invocations", [{"executionSuccessful": True}])[0]
    failures = [r for r in reports if r.error is not None]
    if failures:
        invocation["executionSuccessful"] = False
        invocation.setdefault("toolExecutionNotifications", []).extend(
            {"level": "error", "message": {"text": failure_line(r)}, "descriptor": {"id": "model-not-checked"}}
            for r in failures)
    return json_text(document, indent=2, allow_nan=False) + "\n"
