"""Output formats. Each module converts the one Report into one format; nothing else does."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from preclint.findings import Finding

FORMATS = ("full", "concise", "json", "sarif", "github", "rdjson")


@dataclass
class Report:
    """Everything a run found, in preclint's own terms.

    ``summary`` maps a mode to ``{"predicted_output": {"rel_error", "max_abs_error", "finite"},
    "top_layers": [{"module", "op", "share"}...]}`` (plus ``"measured_output"`` after a probe).
    ``environment`` and ``ledger`` are set by the probe.
    """

    findings: List[Finding] = field(default_factory=list)
    model: Optional[str] = None
    capture: Optional[str] = None
    precisions: Tuple[str, ...] = ()
    summary: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  # e.g. "--no-run: no statistics"
    files: List[str] = field(default_factory=list)  # files checked (source rules)
    tolerance: Optional[Dict[str, float]] = None  # {"rtol", "atol"} when given
    environment: Optional[Dict[str, Any]] = None  # probe only
    ledger: Optional[List[Dict[str, Any]]] = None  # probe only: per-node measured errors

    def sorted_findings(self) -> List[Finding]:
        return sorted(self.findings, key=Finding.sort_key)


def render(report: Report, fmt: str, color: bool = False) -> str:
    """The report in format ``fmt`` as one string (deterministic: same input, same bytes)."""
    if fmt == "json":
        from preclint.report import json_format as module
    elif fmt == "full":
        from preclint.report import console as module
    elif fmt == "concise":
        from preclint.report import concise as module
    elif fmt == "sarif":
        from preclint.report import sarif as module
    elif fmt == "github":
        from preclint.report import github as module
    elif fmt == "rdjson":
        from preclint.report import rdjson as module
    else:
        raise ValueError(fmt)
    return module.render(report, color=color) if fmt == "full" else module.render(report)
