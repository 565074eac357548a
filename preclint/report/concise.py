"""--output-format concise: one line a finding, ``path:line:col: CODE [*] message``.

The shape editors' problem matchers and TorchFix/Ruff users know; ``[*]`` marks a finding ``--fix``
can fix. A finding without a source location (model-level) is printed against the model, then the
counts. Deterministic: findings sorted by path, line, column, code. A finding the probe refuted
ends in ``(refuted by the probe)`` and is counted apart: it does not fail the build.
"""
from __future__ import annotations

from typing import Sequence

from preclint.report.escape import log_line, log_lines, visible
from preclint.report.document import Report, is_refuted, merged, moved_note, review_place


def finding_line(finding, model: str = "", placed: bool = False) -> str:
    """``path:line:col: CODE message`` as preclint prints it, names shown with escapes (report.escape);
    ``placed``: at the place a review format annotates (report.review_place), naming the finding's own
    line when that is elsewhere (a library's)."""
    loc = review_place(finding)[0] if placed else finding.location
    where = f"{loc.path}:{loc.line}:{loc.column}" if loc is not None else (model or "-")
    mark = " [*]" if finding.fixable else ""
    module = f" [{finding.module}]" if finding.module and loc is None else ""
    moved = moved_note(finding, loc) if placed else ""
    refuted = " (refuted by the probe)" if is_refuted(finding) else ""
    message = " ".join(visible(finding.message).split())  # escaped first: a line break in a name stays visible, as \n
    return visible(f"{where}: {finding.code}{mark} {message}{moved}{module}{refuted}")


def render(report: Report) -> str:
    findings = report.sorted_findings()
    lines = [finding_line(f, report.model or "") for f in findings]
    lines += [f"warning: {' '.join(visible(caveat).split())}" for caveat in report.caveats]
    if findings:
        fixable = sum(1 for f in findings if f.fixable)
        refuted = sum(1 for f in findings if is_refuted(f))
        found = f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''}"
        lines.append(found + (f" ({refuted} refuted by the probe)." if refuted else "."))
        if fixable:
            lines.append(f"[*] {fixable} fixable with the `--fix` option.")
    else:
        lines.append("All checks passed!")
    return log_lines("\n".join(lines)) + "\n"


def render_many(reports: Sequence[Report]) -> str:
    """Every checked model's findings and one count; then the models that could not be checked (their
    errors are on stderr), in place of "All checks passed!". Nothing when no model was checked."""
    failed = [visible(r.model or "a model") for r in reports if r.error is not None]
    if len(failed) == len(reports):
        return ""
    text = render(merged(reports))
    if failed:
        text = text.removesuffix("All checks passed!\n") + log_line(
            f"{len(failed)} model{'s' if len(failed) != 1 else ''} could not be checked: {', '.join(failed)}.") + "\n"
    return text
