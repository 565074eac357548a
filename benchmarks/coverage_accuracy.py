"""Predicted against measured output error, per (model, precision), from the JSON reports of
``preclint check --probe``: what benchmarks/coverage.py records for issue 26's target (predicted
within 3x of measured for at least 95% of the pairs).

A pair is one model under one precision whose report holds both a predicted and a measured relative
error of the output. Its factor is max(p, m) / min(p, m), with both figures raised to float32's own
noise first (FLOAT32_NOISE, the floor below which preclint treats an error as float32 rounding): two
errors that are both float32 noise agree, and a prediction of 0 against a measured 1e-3 is 181x off. A model with several outputs is judged by its worst output where the report gives each one's
figures, as a user comparing each output would meet it.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

# 2^-17.5: the geometric midpoint between float32's unit roundoff and the reduced formats' (the same
# floor as preclint/rules/model/unflagged_hotspot.py), below which an error is float32's own.
FLOAT32_NOISE = 2.0 ** -17.5
WITHIN = 3.0  # issue 26's target: within 3x


def factor(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    """How far apart two relative errors are (>= 1), each raised to FLOAT32_NOISE; None without both."""
    if predicted is None or measured is None or not (math.isfinite(predicted) and math.isfinite(measured)):
        return None
    p, m = max(predicted, FLOAT32_NOISE), max(measured, FLOAT32_NOISE)
    return max(p, m) / min(p, m)


def _ratio(predicted: Optional[float], measured: Optional[float]) -> Optional[float]:
    if predicted is None or measured is None:
        return None
    if predicted == 0:
        return None if measured == 0 else math.inf
    return measured / predicted


def _rounded(x: Optional[float]) -> Optional[float]:
    if x is None or not math.isfinite(x):
        return None if x is None else ("inf" if x > 0 else "-inf")  # type: ignore[return-value]
    return float(f"{x:.4g}")


def mode_accuracy(entry: Dict) -> Optional[Dict]:
    """predicted, measured, measured_over_predicted and factor of one mode of a report's summary, with
    ``outputs`` (the same per output) where both sides give each output's figures; None when the mode
    was not both predicted and measured (a mode that failed, a degenerate output, detections only)."""
    predicted = (entry.get("predicted_output") or {}).get("rel_error")
    measured = entry.get("measured_output") or {}
    if predicted is None or measured.get("rel_error") is None:
        return None
    row: Dict = {"predicted": _rounded(predicted), "measured": _rounded(measured["rel_error"]),
                 "measured_over_predicted": _rounded(_ratio(predicted, measured["rel_error"])),
                 "factor": _rounded(factor(predicted, measured["rel_error"]))}
    if entry.get("if_float32_kernels"):
        alternative = entry["if_float32_kernels"].get("rel_error")
        row["predicted_if_float32_kernels"] = _rounded(alternative)
        row["factor_if_float32_kernels"] = _rounded(factor(alternative, measured["rel_error"]))
    each_predicted = entry.get("outputs") or []
    each_measured = measured.get("outputs") or []
    if len(each_predicted) > 1 and len(each_predicted) == len(each_measured):
        outputs = []
        for p, m in zip(each_predicted, each_measured):
            p_err, m_err = (p or {}).get("rel_error"), (m or {}).get("rel_error")
            outputs.append({"output": (p or {}).get("output"), "predicted": _rounded(p_err), "measured": _rounded(m_err),
                            "factor": _rounded(factor(p_err, m_err))})
        row["outputs"] = outputs
        worst = [o["factor"] for o in outputs if isinstance(o["factor"], float)]
        if worst:
            row["factor_overall"] = row["factor"]  # all outputs as one, as the report's headline gives them
            row["factor"] = max(worst + ([row["factor"]] if isinstance(row["factor"], float) else []))
    return row


def report_accuracy(report: Dict) -> Dict[str, Dict]:
    """mode -> mode_accuracy for every mode of ``report`` that was both predicted and measured."""
    rows = {}
    for mode, entry in (report.get("summary") or {}).items():
        row = mode_accuracy(entry)
        if row is not None:
            rows[mode] = row
    return rows


def _far(value) -> bool:
    return value is None or value == "inf" or (isinstance(value, float) and value > WITHIN)


def summarize_accuracy(entries: List[Dict], key: str) -> Dict:
    """Over the models' ``entry[key]["accuracy"]``: the pairs compared, how many lie within 3x, their
    share, and the pairs outside it (worst first). ``within_3x_either_case`` also counts a TF32 pair
    within 3x of the figure preclint gives for float32 kernels, where the backend chooses;
    ``within_3x_overall`` judges a model of several outputs by all of them as one."""
    pairs = [(e["model"], mode, row) for e in entries for mode, row in (e.get(key, {}).get("accuracy") or {}).items()]
    outside = [(model, mode, row) for model, mode, row in pairs if _far(row.get("factor"))]
    overall = sum(1 for _, _, row in pairs if not _far(row.get("factor_overall", row.get("factor"))))
    either = sum(1 for _, _, row in pairs
                 if not _far(row.get("factor")) or ("factor_if_float32_kernels" in row
                                                    and not _far(row["factor_if_float32_kernels"])))

    def worst(item):
        value = item[2].get("factor")
        return -math.inf if value in (None, "inf") else -value

    return {
        "pairs": len(pairs),
        "within_3x": len(pairs) - len(outside),
        "within_3x_fraction": round((len(pairs) - len(outside)) / len(pairs), 4) if pairs else None,
        "within_3x_either_case": either,
        "within_3x_overall": overall,  # a model's outputs judged as one, not by the worst of them
        "outside_3x": [{"model": model, "mode": mode, "predicted": row["predicted"], "measured": row["measured"],
                        "factor": row["factor"]} for model, mode, row in sorted(outside, key=worst)],
    }
