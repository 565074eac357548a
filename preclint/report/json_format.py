"""--output-format json: the fixed schema, one document, deterministic."""
from __future__ import annotations

import json
import math
from typing import Sequence

from preclint import __version__
from preclint.core.notes import texts
from preclint.report.document import Report, top_ledger


def _number(value):
    # JSON has no inf/NaN: a non-finite figure is written as null (the message says what happened)
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return None
    return value


def _numbers(value):
    """``value`` (dicts and lists of figures) with every non-finite number written as null."""
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_numbers(v) for v in value]
    return _number(value)


def _figures(figures) -> dict:
    return {mode: {k: _number(v) for k, v in figure.as_dict().items()} for mode, figure in sorted(figures.items())}


def finding_dict(f) -> dict:
    out = {
        "code": f.code,
        "name": f.name,
        "severity": f.severity,
        "precisions": list(f.precisions),
        "module": f.module,
        "op": f.op,
        "location": f.location.as_dict() if f.location else None,
        "message": f.message,
        "fix": f.fix,
        "predicted": _figures(f.predicted),
    }
    if f.related:
        out["related"] = [{**loc.as_dict(), "message": text} for loc, text in f.related]
    if f.measured or f.status:
        out["measured"] = _figures(f.measured)
        out["status"] = f.status
    return out


def to_dict(report: Report) -> dict:
    summary = {}
    for mode, entry in sorted(report.summary.items()):
        item = {"predicted_output": {k: _number(v) for k, v in entry["predicted_output"].items()}} \
            if "predicted_output" in entry else {}
        if "top_layers" in entry:
            item["top_layers"] = entry["top_layers"]
        if "outputs" in entry:  # a model with several outputs: each one's predicted error
            item["outputs"] = [{k: v if k == "output" else _number(v) for k, v in figure.items()} for figure in entry["outputs"]]
        for key in ("measured_output", "compiled_output", "if_float32_kernels"):
            if key in entry:
                item[key] = {k: _number(v) for k, v in entry[key].items()}
        if "training" in entry:  # --train: the step's figures, predicted (and measured after a probe)
            item["training"] = _numbers(entry["training"])
        summary[mode] = item
    doc = {
        "version": __version__,
        "model": report.model,
        "capture": report.capture,
        "precisions": list(report.precisions),
        "findings": [finding_dict(f) for f in report.sorted_findings()],
        "summary": summary,
    }
    if report.tolerance:
        doc["tolerance"] = report.tolerance
    if report.caveats:
        doc["caveats"] = list(report.caveats)
    if report.notes:
        doc["notes"] = texts(report.notes)
    if report.files:
        doc["files"] = list(report.files)
    if report.environment is not None:
        doc["environment"] = report.environment
    if report.ledger is not None:
        if report.ledger_top is not None:
            doc["nodes"] = top_ledger(report.ledger, report.precisions, report.ledger_top)
            doc["nodes_top"] = report.ledger_top  # per precision: the rest are left out
        else:
            doc["nodes"] = report.ledger
    return doc


def render(report: Report) -> str:
    return json.dumps(to_dict(report), indent=2, sort_keys=False, allow_nan=False) + "\n"


def render_many(reports: Sequence[Report]) -> str:
    """One model: its object; several: a list of them, in the order they were named. A model that
    could not be checked is an object with an ``error``."""
    docs = []
    for report in reports:
        doc = to_dict(report)
        if report.error is not None:
            doc["error"] = report.error
        docs.append(doc)
    return json.dumps(docs[0] if len(docs) == 1 else docs, indent=2, sort_keys=False, allow_nan=False) + "\n"
