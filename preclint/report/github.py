"""--output-format github: GitHub Actions workflow commands that become annotations.

``::warning file=<path>,line=<l>,col=<c>,title=preclint (<CODE>)::<path>:<l>:<c>: <CODE> <message>``,
with the fix on a second line of the message. GitHub shows at most 10 annotations of each level per
step (error, warning, notice), so findings are ranked by severity and position, the first ten of each
level become annotations, the rest are printed as plain log lines, and one notice says how many were
not annotated (over all the models of a run). A model that could not be checked is an error annotation. Values are escaped as @actions/core escapes them: ``%``, CR and LF everywhere, and
also ``:`` and ``,`` inside properties; names are shown with escapes, and the plain lines cannot be read
as workflow commands (report.escape).

Annotations go on the repository's files only: a finding whose line is a library's (a torchvision or
transformers op) is placed on the user's line that calls into the library or builds the model, with
the library's line in the message (report.review_place). Findings the probe refuted do not fail the
build and are not annotated: they are listed in the log, marked as refuted.
"""
from __future__ import annotations

from typing import List, Sequence

from preclint.core.findings import severity_rank
from preclint.report.concise import finding_line
from preclint.report.escape import annotation_data, annotation_property, log_line, visible
from preclint.report.document import Report, failure_line, is_refuted, merged, review_place

LEVELS = {"error": "error", "warning": "warning", "info": "notice"}
PER_LEVEL = 10  # annotations GitHub keeps per level and step
TITLE = annotation_property("preclint")


def annotation(finding, model: str = "") -> str:
    level = LEVELS.get(finding.severity, "warning")
    properties = []
    loc, _ = review_place(finding)
    if loc is not None:
        # CR and LF stay: the runner unescapes them, so the annotation lands on the file of that name
        path = visible(loc.path, keep="\r\n")
        properties += [f"file={annotation_property(path)}", f"line={loc.line}", f"col={loc.column}"]
    properties.append(f"title={annotation_property(f'preclint ({finding.code})')}")
    body = finding_line(finding, model, placed=True)
    if finding.fix:
        body += "\n  help: " + " ".join(visible(finding.fix).split())
    return f"::{level} {','.join(properties)}::{annotation_data(body)}"


def render(report: Report) -> str:
    model = report.model or ""
    # most severe first, so that the annotations GitHub keeps are the ones that matter most
    findings = sorted(report.sorted_findings(), key=lambda f: -severity_rank(f.severity))
    refuted = [f for f in findings if is_refuted(f)]
    findings = [f for f in findings if not is_refuted(f)]
    counts = {level: 0 for level in LEVELS.values()}
    annotated, rest = [], []
    for finding in findings:
        level = LEVELS.get(finding.severity, "warning")
        if counts[level] < PER_LEVEL:
            counts[level] += 1
            annotated.append(finding)
        else:
            rest.append(finding)
    if rest and counts["notice"] == PER_LEVEL:
        # the summary is a notice itself: free a notice slot for it
        last = max(i for i, f in enumerate(annotated) if LEVELS.get(f.severity) == "notice")
        rest.insert(0, annotated.pop(last))
    lines: List[str] = [annotation(f, model) for f in annotated]
    lines += [f"::warning title={TITLE}::{annotation_data(visible(caveat))}" for caveat in report.caveats]
    lines += [log_line(finding_line(f, model)) for f in refuted]
    if rest:
        lines += [log_line(finding_line(f, model, placed=True)) for f in rest]
        lines.append(
            f"::notice title={TITLE}::"
            + annotation_data(
                f"{len(rest)} more finding{'s' if len(rest) != 1 else ''} not shown as annotations "
                f"(GitHub keeps {PER_LEVEL} per level and step); they are listed in the log above."
            )
        )
    return "\n".join(lines) + ("\n" if lines else "")


def render_many(reports: Sequence[Report]) -> str:
    """The findings of every checked model under one cap, after an error annotation for each model
    that could not be checked."""
    failures = "".join(f"::error title={TITLE}::{annotation_data(visible(failure_line(r)))}\n"
                       for r in reports if r.error is not None)
    checked = [r for r in reports if r.error is None]
    return failures + (render(merged(checked)) if checked else "")
