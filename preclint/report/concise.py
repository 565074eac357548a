"""--output-format concise: one line a finding, ``path:line:col: CODE [*] message``.

The shape editors' problem matchers and TorchFix/Ruff users know; ``[*]`` marks a finding ``--fix``
can fix. A finding without a source location (model-level) is printed against the model, then the
counts. Deterministic: findings sorted by path, line, column, code.
"""
from __future__ import annotations

from preclint.report import Report


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
