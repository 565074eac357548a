"""The exit codes of every preclint command, one policy (Ruff's): 0 when no finding at or above
``--fail-on`` stands, 1 when one does, 2 for a usage, input or internal error. ``--exit-zero``
forces 0 for findings, never for errors."""
from __future__ import annotations

from typing import Iterable

from preclint.core.findings import Finding, severity_rank

EXIT_OK, EXIT_FINDINGS, EXIT_ERROR = 0, 1, 2


def exit_code(findings: Iterable[Finding], fail_on: str, exit_zero: bool = False) -> int:
    """EXIT_FINDINGS when a finding at or above ``fail_on`` stands; one the probe measured and refuted
    does not (it is shown as such, and never fails a build)."""
    if exit_zero:
        return EXIT_OK
    threshold = severity_rank(fail_on)
    failing = (f for f in findings if f.status != "refuted")
    return EXIT_FINDINGS if any(severity_rank(f.severity) >= threshold for f in failing) else EXIT_OK
