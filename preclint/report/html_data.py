"""The data the HTML page's charts and finding cards read, prepared from a Report: the nodes along the
model (columnar, per mode, predicted and measured), the output error per precision, the top
contributors, the findings each node carries and the source lines around a finding. Numbers are
rounded to DIGITS significant digits; labels are escaped for plotly."""
from __future__ import annotations

import functools

import math
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from preclint.core.findings import Finding, Location
from preclint.report.escape import chart_label
from preclint.report.document import Report

SNIPPET_CONTEXT = 2  # lines shown above and below a finding's line
DIGITS = 4  # significant digits of the numbers in the page's data: more would print noise as signal


def _num(value) -> Optional[float]:
    if value is None or isinstance(value, bool):
        return None
    value = float(value)
    if not math.isfinite(value):
        return None
    return float(f"{value:.{DIGITS}g}") if value else 0.0


def _source_file(location: Location) -> Optional[Path]:
    """The file a location names: relative to the working directory, or for a library's file, to an
    entry of sys.path (where the library is imported from)."""
    path = Path(location.path)
    if not location.library and path.is_file():
        return path
    for entry in sys.path if location.library else ():
        candidate = Path(entry or ".") / location.path
        if candidate.is_file():
            return candidate
    return None


@functools.lru_cache(maxsize=64)
def _file_lines(path: str, size: int, mtime_ns: int) -> List[str]:
    # read and split once per file, not once per finding in it (keyed on size and time: a fixed
    # file is read again)
    return Path(path).read_text(encoding="utf-8", errors="replace").splitlines()


def source_snippet(location: Optional[Location]) -> Optional[Dict[str, Any]]:
    if location is None:
        return None
    path = _source_file(location)
    if path is None:
        return None
    try:
        info = path.stat()
        lines = _file_lines(str(path), info.st_size, info.st_mtime_ns)
    except OSError:
        return None
    if not 1 <= location.line <= len(lines):
        return None
    first = max(1, location.line - SNIPPET_CONTEXT)
    last = min(len(lines), location.line + SNIPPET_CONTEXT)
    return {"first": first, "line": location.line, "lines": lines[first - 1:last]}


def chart_nodes(report: Report) -> Dict[str, Any]:
    """The nodes along the model, columnar: names, module paths and, per mode, predicted (p*) and
    measured (m*) local and received relative error and share of the output error. What the charts
    show (labels, module paths, places) is escaped for plotly, which renders tags in labels."""
    rows = report.profile or []
    measured = {row["node"]: row for row in report.ledger or []}
    if not rows:  # a probe without the predicted profile: the ledger alone
        rows = [dict(row, modes={}) for row in report.ledger or []]
    names, modules, labels, locations = [], [], [], []
    series: Dict[str, Dict[str, List[Optional[float]]]] = {
        mode: {key: [] for key in ("pl", "pr", "ps", "ml", "mr", "ms")} for mode in report.precisions}
    for row in rows:
        names.append(row["node"])
        modules.append(chart_label(row.get("module") or ""))
        op = row.get("op") or row["node"]
        module = row.get("module") or ""
        labels.append(chart_label(module if op.startswith("nn.") and module else (f"{op} in {module}" if module else op)))
        loc = row.get("location")
        locations.append(chart_label(f"{loc['path']}:{loc['line']}") if loc else "")
        ledger_row = measured.get(row["node"], {}).get("modes", {})
        for mode, columns in series.items():
            p = row["modes"].get(mode, {})
            m = ledger_row.get(mode, {})
            columns["pl"].append(_num(p.get("local")))
            columns["pr"].append(_num(p.get("received")))
            columns["ps"].append(_num(p.get("share")))
            columns["ml"].append(_num((m.get("local") or {}).get("rel_error")))
            columns["mr"].append(_num((m.get("received") or {}).get("rel_error")))
            columns["ms"].append(_num(m.get("contribution")))
    return {"names": names, "modules": modules, "labels": labels, "locations": locations, "series": series,
            "measured": report.ledger is not None}


def output_errors(report: Report) -> List[Dict[str, Any]]:
    out = []
    for mode in report.precisions:
        entry = report.summary.get(mode, {})
        predicted = entry.get("predicted_output", {})
        measured = entry.get("measured_output")
        out.append({
            "mode": mode,
            "predicted": _num(predicted.get("rel_error")),
            "predicted_finite": predicted.get("finite"),
            "measured": _num(measured.get("rel_error")) if measured and "error" not in measured else None,
            "measured_finite": measured.get("finite") if measured else None,
        })
    return out


def top_contributors(report: Report, nodes: Dict[str, Any], count: int = 10) -> Dict[str, List[Dict[str, Any]]]:
    """Per mode, the layers with the largest share of the output error, measured where the probe ran
    (else predicted), each with both shares: a module called several times is one layer, its calls'
    shares added up (as the text report counts them). ``i``: the layer's first node."""
    top = {}
    for mode in report.precisions:
        columns = nodes["series"][mode]
        layers: Dict[str, Dict[str, Any]] = {}
        for i, label in enumerate(nodes["labels"]):
            if columns["ps"][i] is None and columns["ms"][i] is None:
                continue
            layer = layers.setdefault(label, {"i": i, "label": label, "predicted": None, "measured": None})
            for key, column in (("predicted", "ps"), ("measured", "ms")):
                if columns[column][i] is not None:
                    layer[key] = _num((layer[key] or 0.0) + columns[column][i])
        key = "measured" if nodes["measured"] else "predicted"
        ranked = sorted((layer for layer in layers.values() if layer[key]), key=lambda layer: -abs(layer[key]))
        top[mode] = ranked[:count]
    return top


def finding_refs(findings: List[Finding], nodes: Dict[str, Any], anchor: str) -> Dict[str, List[Dict[str, str]]]:
    """Node index -> the findings about it, with the anchor of each one's card."""
    index = {name: i for i, name in enumerate(nodes["names"])}
    refs: Dict[str, List[Dict[str, str]]] = {}
    for k, f in enumerate(findings):
        if f.node in index:
            refs.setdefault(str(index[f.node]), []).append(
                {"id": f"{anchor}-f{k}", "code": f.code, "severity": f.severity,
                 "status": f.status or "", "modes": list(f.precisions)})
    return refs
