"""--output-format full (the default): findings grouped by file, then a table per precision mode."""
from __future__ import annotations

import io
from itertools import groupby
from typing import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from preclint.findings import percent, sci
from preclint.report import Report

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _figure_line(f) -> str:
    parts = []
    for mode in sorted(set(f.predicted) | set(f.measured)):
        figure = f.predicted.get(mode)
        measured = f.measured.get(mode)
        text = ""
        if figure is not None and (figure.rel_error is not None or figure.flip_fraction is not None):
            text = f"{mode} {sci(figure.rel_error)}"
            if figure.flip_fraction is not None:
                text += f" (flips {percent(figure.flip_fraction)})"
        if measured is not None:
            shown = sci(measured.rel_error) if measured.rel_error is not None else "inf/NaN"
            if measured.flip_fraction is not None:
                shown += f" (flips {percent(measured.flip_fraction)})"
            text = (f"{text} / measured {shown}" if text else f"{mode} measured {shown}")
            if measured.status and f.status and measured.status != f.status:
                text += f" ({measured.status})"
        if text:
            parts.append(text)
    return ", ".join(parts)


def _measured_cell(entry) -> str:
    measured = entry.get("measured_output")
    if measured is None:
        return "n/a"
    if "error" in measured:
        return "not measured"
    if measured.get("finite") is False:
        return "inf/NaN"
    text = sci(measured.get("rel_error"))
    if measured.get("flip_fraction") is not None:
        text += f" (flips {percent(measured['flip_fraction'])})"
    return text


def _share(share) -> str:
    """A contribution: signed (an error can cancel part of the others), 0% below a twentieth of a percent."""
    if share is None:
        return "n/a"
    if abs(share) < 0.0005:
        return "0%"
    return ("-" if share < 0 else "") + percent(abs(share))


def _ledger_tables(console: Console, report: Report) -> None:
    """`preclint probe`: per mode, every node that adds error, with what reaches it and its share."""
    modes = list(report.precisions)
    for mode in modes:
        rows = []
        hidden = 0
        for row in report.ledger:
            m = row["modes"].get(mode)
            if m is None or "error" in m:
                continue
            local = (m.get("local") or {}).get("rel_error")
            share = m.get("contribution")
            if not (local or share or m.get("flips") or m.get("nonfinite")):
                hidden += 1
                continue
            name = row["module"] if row["op"].startswith("nn.") and row["module"] else (
                f"{row['op']} in {row['module']}" if row["module"] else row["op"])
            where = str(row["location"]["line"]) if row.get("location") else ""
            notes = []
            if m.get("tf32_applied") is not None:
                notes.append("TF32" if m["tf32_applied"] else "fp32 kernel")
            if m.get("nonfinite"):
                notes.append("inf/NaN")
            if m.get("flips") is not None:
                notes.append(f"flips {m['flips']}/{m['units']}")
            rows.append([name, where, m.get("dtype") or "", sci(local),
                         sci((m.get("received") or {}).get("rel_error")) if not m.get("nonfinite") else "inf/NaN",
                         sci(m.get("amplification")), _share(share), ", ".join(notes)])
        if not rows:
            continue
        console.print()
        table = Table(title=f"Measured per layer under {mode}", title_justify="left", show_edge=False)
        for column, justify in (("layer", "left"), ("line", "right"), ("dtype", "left"), ("local", "right"),
                                ("received", "right"), ("amplification", "right"), ("share", "right"), ("", "left")):
            table.add_column(column, justify=justify)
        for r in rows:
            table.add_row(*r)
        console.print(table)
        if hidden:
            console.print(Text(f"{hidden} nodes that add no error and hold no share are not shown; "
                               "--output-format json lists every node.", style="dim"))


def render(report: Report, color: bool = False, width: int = 110) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, soft_wrap=False)
    findings = report.sorted_findings()
    if report.model:
        console.print(Text.assemble(("preclint ", "bold"), f"{report.model} (captured with {report.capture}; "
                                    f"precisions {', '.join(report.precisions)})"))
    for path, group in groupby(findings, key=lambda f: f.location.path if f.location else ""):
        console.print()
        console.print(Text(path or "(model)", style="bold underline"))
        for f in group:
            where = f"{f.location.line}:{f.location.column}" if f.location else "-"
            head = Text.assemble(f"  {where} ", (f.code, _SEVERITY_STYLE.get(f.severity, "")), f" [{f.severity}] ",
                                 (f"{f.status} " if f.status else ""), f.message)
            console.print(head)
            figures = _figure_line(f)
            if figures:
                console.print(Text(f"      relative error: {figures}", style="dim"))
            for loc, text in f.related:
                console.print(Text(f"      note: {loc.path}:{loc.line}: {text}", style="dim"))
            console.print(Text(f"      help: {f.fix}", style="green"))
    if report.summary:
        console.print()
        table = Table(title="Predicted output error", title_justify="left", show_edge=False)
        table.add_column("precision")
        table.add_column("relative RMS", justify="right")
        table.add_column("max abs", justify="right")
        table.add_column("finite")
        measured = any("measured_output" in e for e in report.summary.values())
        if measured:
            table.add_column("measured rel RMS", justify="right")
        table.add_column("layers contributing most")
        for mode, entry in report.summary.items():
            out = entry["predicted_output"]
            layers = ", ".join(f"{t['module']} {percent(t['share'])}" for t in entry.get("top_layers", [])[:3])
            row = [mode, sci(out["rel_error"]), sci(out["max_abs_error"]),
                   "n/a" if out["finite"] is None else ("yes" if out["finite"] else "NO")]
            if measured:
                row.append(_measured_cell(entry))
            row.append(layers or "-")
            table.add_row(*row)
        console.print(table)
    if report.ledger:
        _ledger_tables(console, report)
    for note in report.notes:
        console.print(Text(f"note: {note}", style="dim"))
    counts = {s: sum(1 for f in findings if f.severity == s) for s in ("error", "warning", "info")}
    total = len(findings)
    console.print()
    if total:
        console.print(f"Found {total} finding{'s' if total != 1 else ''} "
                      f"({counts['error']} error, {counts['warning']} warning, {counts['info']} info).")
    else:
        console.print("No findings.")
    return buffer.getvalue()


def render_many(reports: Sequence[Report], color: bool = False) -> str:
    """Each checked model's report; a closing line names the models that could not be checked (their
    errors are on stderr). Nothing when no model was checked."""
    checked = [r for r in reports if r.error is None]
    if not checked:
        return ""
    text = "".join(render(r, color=color) for r in checked)
    failed = [r.model or "a model" for r in reports if r.error is not None]
    if failed:
        text += f"{len(failed)} model{'s' if len(failed) != 1 else ''} could not be checked: {', '.join(failed)}.\n"
    return text
