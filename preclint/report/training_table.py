"""The console's training section (``--train``): per precision, one step's figures against float64,
predicted and, after a probe, measured beside them; the parameter that loses most."""
from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from preclint.core.findings import percent, sci
from preclint.report.escape import visible


def _cell(predicted, measured, key: str, fmt) -> str:
    def shown(figures):
        value = figures.get(key)
        return "inf/NaN" if value is None and key == "grad_rel_error" else fmt(value)

    text = shown(predicted)
    return text + (f" ({shown(measured)})" if measured is not None else "")


def _worst(figures) -> str:
    rows = figures.get("parameters", [])
    for key, what in (("nonfinite_updates", "non-finite"), ("underflow_fraction", "flushed"),
                      ("lost_update_fraction", "lost")):
        ranked = sorted(rows, key=lambda r: -(r.get(key) or 0))
        if ranked and (ranked[0].get(key) or 0) > 0.01:
            value = ranked[0][key]
            return f"{ranked[0]['parameter']} ({value if key == 'nonfinite_updates' else percent(value)} {what})"
    return "-"


def training_table(console: Console, summary) -> None:
    entries = {mode: entry["training"] for mode, entry in summary.items() if "training" in entry}
    if not entries:
        return
    measured = any("measured" in e for e in entries.values())
    console.print()
    title = "Training step against float64" + (" (predicted, measured in brackets)" if measured else " (predicted)")
    table = Table(title=title, title_justify="left", show_edge=False)
    for column in ("precision", "grad rel RMS", "grads flushed", "updates lost", "non-finite", "loss scale",
                   "parameter losing most"):
        table.add_column(column, justify="left" if column in ("precision", "parameter losing most") else "right")
    for mode, entry in entries.items():
        p, m = entry["predicted"], entry.get("measured")
        scale = f"{p.get('loss_scale', 1.0):g}" + (f", {p['skipped_steps']} skipped" if p.get("skipped_steps") else "")
        table.add_row(*(Text(visible(cell)) for cell in (
            mode, _cell(p, m, "grad_rel_error", sci), _cell(p, m, "underflow_fraction", percent),
            _cell(p, m, "lost_update_fraction", percent), _cell(p, m, "nonfinite_updates", str), scale, _worst(p))))
    console.print(table)
    _scaled_table(console, entries)
    for mode, entry in entries.items():
        path = entry.get("trajectory")
        if path:
            parted = f"parts from float32's loss at step {path['parts_at']}" if path["parts_at"] else \
                "follows float32's loss (within 1%)"
            drift = path["weight_drift"][-1]
            console.print(Text(visible(f"{mode} over {path['steps']} steps: {parted}; its weights' movement differs "
                                       f"from float32's by {'inf/NaN' if drift is None else percent(drift)} of it"),
                               style="dim"))


SCALED_ROWS = 8  # converted layers shown per precision, those whose gradient flushes most first


def _scaled_table(console: Console, entries) -> None:
    """The scaled modes' converted layers: their output gradient's per-tensor scale and flushed share
    (over the tensor and across blocks of 32), and the flushed share of their input and weight."""
    rows = []
    for mode, entry in entries.items():
        predicted, measured = entry["predicted"].get("scaled") or {}, (entry.get("measured") or {}).get("scaled")
        ranked = sorted(predicted.items(), key=lambda item: -item[1].get("grad_output", {}).get("underflow_fraction", 0.0))
        for path, stats in ranked[:SCALED_ROWS]:
            seen = (measured or {}).get(path, {})

            def flushed(operand: str) -> str:
                text = percent(stats[operand]["underflow_fraction"]) if operand in stats else "-"
                if measured is not None and operand in seen:
                    text += f" ({percent(seen[operand]['underflow_fraction'])})"
                return text

            grad = stats.get("grad_output")
            blocks = "/".join(percent(v) for v in grad["blocks"]["underflow_fraction"]) if grad else "-"
            scale = f"{grad['element'].upper()} {sci(grad['tensor_scale'])}" if grad else "-"
            rows.append((mode, path, scale, flushed("grad_output"), blocks, flushed("input"), flushed("weight")))
    if not rows:
        return
    console.print()
    table = Table(title="Scaled GEMMs in the step: values flushed to 0" + (" (measured in brackets)" if any(
        "measured" in e for e in entries.values()) else ""), title_justify="left", show_edge=False)
    for column in ("precision", "layer", "grad format, tensor scale", "grad flushed", "per block of 32 (min/med/p99)",
                   "input flushed", "weight flushed"):
        table.add_column(column, justify="left" if column in ("precision", "layer") else "right")
    for row in rows:
        table.add_row(*(Text(visible(cell)) for cell in row))
    console.print(table)
