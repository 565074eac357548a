"""The one Report every output format converts, and what the formats share about it: where the
review formats place a finding, how a run's reports merge, the ledger's ranking."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Dict, List, Optional, Sequence, Tuple

from preclint.core.findings import Finding, Location
from preclint.core.notes import Note


@dataclass
class Report:
    """Everything a run found, in preclint's own terms.

    ``summary`` maps a mode to ``{"predicted_output": {"rel_error", "max_abs_error", "finite"},
    "top_layers": [{"module", "op", "share"}...]}`` (plus ``"measured_output"`` after a probe, and
    ``"outputs": [{"output", "rel_error", "max_abs_error", "finite"}...]`` for a model with several).
    ``environment`` and ``ledger`` are set by the probe.
    """

    findings: List[Finding] = field(default_factory=list)
    model: Optional[str] = None
    capture: Optional[str] = None
    precisions: Tuple[str, ...] = ()
    summary: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    notes: List[Note] = field(default_factory=list)  # e.g. Note("reference", "--no-run: no reference pass; ...")
    # what makes the result vacuous (a degenerate output): every format shows these, the terse ones too
    caveats: List[str] = field(default_factory=list)
    files: List[str] = field(default_factory=list)  # files checked (source rules)
    tolerance: Optional[Dict[str, float]] = None  # {"rtol", "atol"} when given
    environment: Optional[Dict[str, Any]] = None  # probe only
    ledger: Optional[List[Dict[str, Any]]] = None  # probe only: per-node measured errors
    # per node in execution order, the predicted errors: {"node", "module", "op", "kind", "location",
    # "modes": {mode: {"local", "received", "share"}}} (relative RMS; share of the output error)
    profile: Optional[List[Dict[str, Any]]] = None
    ledger_top: Optional[int] = None  # show only the N nodes with the largest share per mode (--top)
    error: Optional[str] = None  # the model could not be checked: why (one line)

    def sorted_findings(self) -> List[Finding]:
        return sorted(self.findings, key=Finding.sort_key)


def ranked_ledger(rows: List[Dict[str, Any]], mode: str) -> List[Dict[str, Any]]:
    """The ledger's rows measured under ``mode``, largest share first (rows without one last, in
    execution order): what ``--top N`` cuts."""
    measured = [(i, row) for i, row in enumerate(rows) if "error" not in row["modes"].get(mode, {"error": 1})]

    def key(item):
        share = item[1]["modes"][mode].get("contribution")
        return (share is None, -(share or 0.0), item[0])

    return [row for _, row in sorted(measured, key=key)]


def top_ledger(rows: List[Dict[str, Any]], modes, top: int) -> List[Dict[str, Any]]:
    """The rows among the ``top`` largest shares of any mode, in execution order."""
    keep = {id(row) for mode in modes for row in ranked_ledger(rows, mode)[:top]}
    return [row for row in rows if id(row) in keep]


def is_refuted(finding: Finding) -> bool:
    """Whether the probe measured the finding and found it wrong: shown as such, never failing a build."""
    return finding.status == "refuted"


def review_place(finding: Finding) -> Tuple[Optional[Location], List[Tuple[Location, str]]]:
    """Where the formats meant for code review (SARIF, GitHub, reviewdog) put a finding, and its
    other places: its own location when that is a file of the user's project; else the first related
    location that is (the user's line that calls into a library or builds the model), with the
    finding's own place (a library's line) moved among the related ones. None when no place is in
    the project: a review can only annotate the project's files."""
    related = [(loc, text) for loc, text in finding.related if loc is not None]
    own = finding.location
    if own is None or own.in_project:
        return own, related
    primary = next((loc for loc, _ in related if loc.in_project), None)
    moved = [(own, f"{finding.op or 'the op'} is made here" + (" (library code)" if own.library else ""))]
    return primary, moved + [(loc, text) for loc, text in related if loc != primary]


def moved_note(finding: Finding, primary: Optional[Location]) -> str:
    """For a finding a review format placed away from its own location: where it really is, to append
    to its message ("" when it stays)."""
    own = finding.location
    if own is None or own == primary:
        return ""
    return f" [at {own.path}:{own.line}" + (", library code]" if own.library else "]")


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
