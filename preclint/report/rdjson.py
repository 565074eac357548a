"""--output-format rdjson: reviewdog's Diagnostic Format (one DiagnosticResult), for
``preclint check --output-format rdjson . | reviewdog -f=rdjson -reporter=github-pr-review``.

reviewdog counts columns in UTF-8 bytes from 1; preclint's columns are code points, so they are
converted from the line's text here. Only the start of a finding is known, so ranges carry a start
alone. Model-level findings without a location are kept, without a location.

A finding whose line is a library's is placed on the user's line that calls into the library or
builds the model (report.review_place), naming the library's line in its message; the other places
in the project are ``related_locations``. A finding the probe refuted is kept as INFO, marked as
refuted, so that a reviewdog ``-fail-level`` of warning or above passes it. Several models make one
DiagnosticResult. Messages and paths carry the raw names (JSON holds any text); ``original_output`` is
the line as the concise format prints it, names escaped (report.escape).
"""
from __future__ import annotations

import os
from typing import Sequence

from preclint.report.concise import finding_line
from preclint.report.escape import json_text
from preclint.report.document import Report, failure_line, is_refuted, merged, moved_note, review_place
from preclint.text.lines import utf8_column

SEVERITIES = {"error": "ERROR", "warning": "WARNING", "info": "INFO"}


def _location(loc) -> dict:
    column = utf8_column(loc.path, loc.line, loc.column)
    return {"path": loc.path, "range": {"start": {"line": loc.line, "column": column}}}


def _diagnostic(finding, model: str) -> dict:
    loc, related = review_place(finding)
    message = ("Refuted by the probe: " if is_refuted(finding) else "") + " ".join(finding.message.split())
    message += moved_note(finding, loc)
    if finding.fix:
        message += f"\nhelp: {' '.join(finding.fix.split())}"
    diagnostic = {"message": message}
    if loc is not None:
        diagnostic["location"] = _location(loc)
    diagnostic["severity"] = "INFO" if is_refuted(finding) else SEVERITIES.get(finding.severity, "WARNING")
    diagnostic["source"] = {"name": "preclint"}
    diagnostic["code"] = {"value": finding.code}
    in_project = [{"message": text, "location": _location(place)} for place, text in related if place.in_project]
    if in_project:
        diagnostic["related_locations"] = in_project
    diagnostic["original_output"] = finding_line(finding, model, placed=True)
    return diagnostic


def to_dict(report: Report) -> dict:
    return {
        "source": {"name": "preclint"},
        "diagnostics": [_diagnostic(f, report.model or "") for f in report.sorted_findings()],
    }


def render(report: Report) -> str:
    return json_text(to_dict(report), indent=2) + "\n"


def render_many(reports: Sequence[Report]) -> str:
    """One DiagnosticResult for every model; a model that could not be checked is an ERROR diagnostic
    (on its file, when it is one)."""
    document = to_dict(merged(reports))
    for report in reports:
        if report.error is not None:
            diagnostic = {"message": failure_line(report), "severity": "ERROR", "source": {"name": "preclint"}}
            if report.model and os.path.isfile(report.model):
                diagnostic["location"] = {"path": report.model}
            document["diagnostics"].append(diagnostic)
    return json_text(document, indent=2) + "\n"
