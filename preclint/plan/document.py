"""The plan as a document: what it keeps in float32 and why, the errors predicted (and measured)
before and after, and its JSON, which ``preclint plan --output-format json`` writes and
``preclint.policy.load_policy`` reads back."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from preclint.core.findings import ErrorFigure
from preclint.measure.compare import Tolerance

PLAN_VERSION = 1


@dataclass
class KeepEntry:
    module: str
    op: Optional[str]
    reason: str
    share: Optional[float]  # the unit's share of the predicted output error variance before the plan
    flops_fraction: float = 0.0
    alternative: Optional[str] = None  # a fix that keeps the speed, where a rule knows one

    def to_json(self) -> Dict[str, Any]:
        out = {"module": self.module, "op": self.op, "reason": self.reason,
               "share": None if self.share is None else round(self.share, 4),
               "flops_fraction": round(self.flops_fraction, 6)}
        if self.alternative:
            out["alternative"] = self.alternative
        return out


def figure_json(figure: ErrorFigure) -> Dict[str, Any]:
    """An output's error as the plan's JSON gives it, before and after: four significant digits."""
    return {"rel_error": _sig(figure.rel_error), "max_abs_error": _sig(figure.max_abs_error), "finite": figure.finite,
            "failing_fraction": _sig(figure.failing_fraction), "flip_fraction": _sig(figure.flip_fraction)}


@dataclass
class Plan:
    """The plan as ``preclint plan --output-format json`` writes it (``to_json``), and as
    ``preclint.policy.load_policy`` reads it back."""

    model: str
    precision: str
    tolerance: Tolerance
    keep: List[KeepEntry] = field(default_factory=list)
    kept_flops_fraction: float = 0.0
    predicted: Dict[str, ErrorFigure] = field(default_factory=dict)  # "before", "after"
    measured: Optional[Dict[str, Any]] = None  # "before", "after", "float32", "device", "runs"
    meets_tolerance: bool = False
    notes: List[str] = field(default_factory=list)
    onnx_exclude: List[str] = field(default_factory=list)  # nodes_to_exclude-style regular expressions
    source_diff: Optional[str] = None

    @property
    def modules(self) -> List[str]:
        return [k.module for k in self.keep if k.op is None]

    def policy(self) -> Dict[str, Any]:
        return {"precision": self.precision, "keep": [{"module": k.module, "op": k.op} for k in self.keep]}

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {
            "version": PLAN_VERSION,
            "model": self.model,
            "precision": self.precision,
            "tolerance": {"rtol": self.tolerance.rtol, "atol": self.tolerance.atol},
            "keep": [k.to_json() for k in self.keep],
            "kept_flops_fraction": round(self.kept_flops_fraction, 6),
            "predicted": {k: figure_json(v) for k, v in self.predicted.items()},
            "meets_tolerance": self.meets_tolerance,
        }
        if self.tolerance.max_flip is not None:
            out["tolerance"]["max_flip"] = self.tolerance.max_flip
        if self.measured is not None:
            out["measured"] = {k: (figure_json(v) if isinstance(v, ErrorFigure) else v) for k, v in self.measured.items()}
        out["onnx_nodes_to_exclude"] = list(self.onnx_exclude)
        out["notes"] = list(self.notes)
        return out


def _sig(value: Optional[float]) -> Optional[float]:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}")
