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
    for mode, entry in entries.items():
        path = entry.get("trajectory")
        if path:
            parted = f"parts from float32's loss at step {path['parts_at']}" if path["parts_at"] else \
                "follows float32's loss (within 1%)"
            drift = path["weight_drift"][-1]
            console.print(Text(visible(f"{mode} over {path['steps']} steps: {parted}; its weights' movement differs "
                                       f"from float32's by {'inf/NaN' if drift is None else percent(drift)} of it"),
                               style="dim"))
