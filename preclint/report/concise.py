"""--output-format concise: one line a finding, ``path:line:col: CODE [*] message``.

The shape editors' problem matchers and TorchFix/Ruff users know; ``[*]`` marks a finding ``--fix``
can fix. A finding without a source location (model-level) is printed against the model, then the
counts. Deterministic: findings sorted by path, line, column, code.
"""
from __future__ import annotations

from typing import Sequence

from preclint.report import Report, merged


def finding_line(finding, model: str = "") -> str:
    loc = finding.location
    where = f"{loc.path}:{loc.line}:{loc.column}" if loc is not None else (model or "-")
    mark = " [*]" if finding.fixable else ""
    module = f" [{finding.module}]" if finding.module and loc is None else ""
    return f"{where}: {finding.code}{mark} {' '.join(finding.message.split())}{module}"


def render(report: Report) -> str:
    findings = report.sorted_findings()
    lines = [finding_line(f, report.model or "") for f in findings]
    if findings:
        fixable = sum(1 for f in findings if f.fixable)
        lines.append(f"Found {len(findings)} finding{'s' if len(findings) != 1 else ''}.")
        if fixable:
            lines.append(f"[*] {fixable} fixable with the `--fix` option.")
    else:
        lines.append("All checks passed!")
    return "\n".join(lines) + "\n"


def render_many(reports: Sequence[Report]) -> str:
    """Every checked model's findings and one count; then the models that could not be checked (their
    errors are on stderr), in place of "All checks passed!". Nothing when no model was checked."""
    failed = [r.model or "a model" for r in reports if r.error is not None]
    if len(failed) == len(reports):
        return ""
    text = render(merged(reports))
    if failed:
        text = text.removesuffix("All checks passed!\n") + (
            f"{len(failed)} model{'s' if len(failed) != 1 else ''} could not be checked: {', '.join(failed)}.\n")
    return text
