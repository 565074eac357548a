"""--output-format concise: one line a finding, ``path:line:col: CODE [*] message``.

The shape editors' problem matchers and TorchFix/Ruff users know; ``[*]`` marks a finding ``--fix``
can fix. A finding without a source location (model-level) is printed against the model, then the
counts. Deterministic: findings sorted by path, line, column, code.
"""
from __future__ import annotations

from typing import Sequence

from preclint.report import Report


def finding_line(finding, model: str = "") -> str:
    loc = finding.location
    where = f"{loc.path}:{loc.line}:{loc.column}" if loc is not None else (model or "-")
    mark = " [*]" if finding.fixable else ""
    module = f" [{finding.module}]" if finding.module and loc is None else ""
    return f"{where}: {finding.code}{mark} {' '.join(finding.message.split())}{module}"


def render_many(reports: Sequence[Report]) -> str:
    """Each checked model's findings, then one count for the run (nothing when no model was checked:
    the errors on stderr say why)."""
    checked = [r for r in reports if r.error is None]
    if not checked:
        return ""
    lines, fixable, total = [], 0, 0
    for report in checked:
        findings = report.sorted_findings()
        lines += [finding_line(f, report.model or "") for f in findings]
        fixable += sum(1 for f in findings if f.fixable)
        total += len(findings)
    failed = len(reports) - len(checked)
    unchecked = f"; {failed} model{'s' if failed != 1 else ''} could not be checked" if failed else ""
    if total:
        lines.append(f"Found {total} finding{'s' if total != 1 else ''}{unchecked}.")
        if fixable:
            lines.append(f"[*] {fixable} fixable with the `--fix` option.")
    else:
        lines.append(f"No findings{unchecked}." if failed else "All checks passed!")
    return "\n".join(lines) + "\n"
