"""--output-format full (the default): findings grouped by file, then a table per precision mode."""
from __future__ import annotations

import io
from itertools import groupby

from rich.console import Console
from rich.table import Table
from rich.text import Text

from preclint.findings import percent, sci
from preclint.report import Report

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def _figure_line(f) -> str:
    parts = []
    for mode, figure in sorted(f.predicted.items()):
        if figure.rel_error is None and figure.flip_fraction is None:
            continue
        text = f"{mode} {sci(figure.rel_error)}"
        if figure.flip_fraction is not None:
            text += f" (flips {percent(figure.flip_fraction)})"
        measured = f.measured.get(mode)
        if measured is not None and measured.rel_error is not None:
            text += f" / measured {sci(measured.rel_error)}"
        parts.append(text)
    return ", ".join(parts)


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
                row.append(sci(entry.get("measured_output", {}).get("rel_error")))
            row.append(layers or "-")
            table.add_row(*row)
        console.print(table)
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
