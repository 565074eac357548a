"""Output formats. Each module converts the one Report into one format; nothing else does.

A run over several models prints one output: one JSON, SARIF or rdjson document, one set of GitHub
annotations, one text report. A model that could not be checked is a Report with an ``error``; the
document formats carry it, the text formats leave it to the error line on stderr.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
    error: Optional[str] = None  # the model could not be checked: why (one line)

    def sorted_findings(self) -> List[Finding]:
        return sorted(self.findings, key=Finding.sort_key)


def _format_module(fmt: str):
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
    return module


def render(report: Report, fmt: str, color: bool = False) -> str:
    """The report in format ``fmt`` as one string (deterministic: same input, same bytes)."""
    return render_reports([report], fmt, color)


def render_reports(reports: Sequence[Report], fmt: str, color: bool = False) -> str:
    """The reports of one run (one per model) as one output in format ``fmt``."""
    module = _format_module(fmt)
    return module.render_many(reports, color=color) if fmt == "full" else module.render_many(reports)


def failure_line(report: Report) -> str:
    """What the document formats say about a model that could not be checked."""
    return f"preclint could not check {report.model or 'the model'}: {report.error}"


def merged(reports: Sequence[Report]) -> Report:
    """The reports of the models that were checked as one, for the formats that list results flat
    (concise, SARIF, GitHub, rdjson): their lists (findings, notes, files...) joined in order."""
    checked = [r for r in reports if r.error is None]
    if len(checked) == 1:
        return checked[0]
    lists = [f.name for f in fields(Report) if f.default_factory is list]  # type: ignore[comparison-overlap]
    return Report(**{name: [item for r in checked for item in getattr(r, name)] for name in lists})
