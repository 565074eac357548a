"""--output-format full (the default): findings grouped by file, then a table per precision mode.

What users name is printed as rich Text of report.escape's visible text, never as markup (a module
named ``[/]`` is a name, not a closing tag), and no line of the report can be read as a CI runner's
workflow command."""
from __future__ import annotations

import io
import re
from itertools import groupby
from typing import Dict, Optional, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from preclint.core.findings import percent, sci
from preclint.report.escape import log_lines, visible
from preclint.report.document import Report, is_refuted, ranked_ledger
from preclint.report.training_table import training_table

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
            if measured.flip_fraction is not None:
                # a decision's figure is its flips; the error of what it reads may be unmeasured (integer
                # or empty inputs): no figure then, never a made-up inf/NaN
                shown = f"flips {percent(measured.flip_fraction)}"
                if measured.rel_error is not None:
                    shown = f"{sci(measured.rel_error)} ({shown})"
            else:
                shown = sci(measured.rel_error) if measured.rel_error is not None else "inf/NaN"
            text = (f"{text} / measured {shown}" if text else f"{mode} measured {shown}")
            if measured.status and f.status and measured.status != f.status:
                text += f" ({measured.status})"
        if text:
            parts.append(text)
    return ", ".join(parts)


# An output's name in the table is at most this long: the head of the path, an ellipsis and its last
# part in full (output['text_m…['last_hidden_state']), longer only where two would read alike.
OUTPUT_LABEL_WIDTH = 36


def output_labels(names: Sequence[str], width: int = OUTPUT_LABEL_WIDTH) -> Dict[str, str]:
    """Each output's name as the table shows it: whole where it fits ``width``, else shortened from
    the middle, keeping its last part (the key or index that tells it from its siblings); a name that
    would read like another's keeps more of its head, up to all of it."""
    labels: Dict[str, str] = {}
    for name in names:
        cut = width
        while True:
            label = _middle_cut(name, cut)
            if label == name or not any(_middle_cut(other, cut) == label for other in names if other != name):
                break
            cut += 4
        labels[name] = label
    return labels


def _middle_cut(name: str, width: int) -> str:
    if len(name) <= width:
        return name
    parts = re.split(r"(?=\[|\.)", name)
    tail = parts[-1] if len(parts) > 1 and len(parts[-1]) <= width - 8 else name[-(width // 2):]
    return name[:width - len(tail) - 1] + "…" + tail


def _measured_cell(entry, output: Optional[int] = None) -> str:
    """The measured figure of a mode; ``output``: of that one of several outputs (its own row), where
    the probe measured each of them as the check predicted them."""
    measured = entry.get("measured_output")
    if measured is None:
        return "n/a"
    if "error" in measured:
        return "not measured" if not output else ""
    if output is not None:
        each = measured.get("outputs") or []
        if len(each) != len(entry.get("outputs") or ()) or each[output] is None:
            return _measured_cell(entry) if output == 0 else ""
        measured = each[output]
    if measured.get("finite") is False:
        return "inf/NaN"
    text = sci(measured.get("rel_error"))
    if measured.get("flip_fraction") is not None:
        text += f" (flips {percent(measured['flip_fraction'])})"
    return text


def _compiled_table(console, report) -> None:
    """Eager and compiled output error per precision (``--backend``), against the same reference."""
    entries = {mode: e["compiled_output"] for mode, e in report.summary.items() if "compiled_output" in e}
    if not entries:
        return
    backend = ((report.environment or {}).get("backend") or {}).get("backend", "compiled")
    table = Table(title=f"Compiled ({backend}) and eager output error, against the same float64 reference",
                  title_justify="left", show_edge=False)
    for column in ("precision", "eager", backend, "difference", "compiled vs eager", "emulate_precision_casts"):
        table.add_column(column, justify="left" if column == "precision" else "right")
    for mode, c in entries.items():
        difference = c.get("difference")
        shown = "n/a" if difference is None else ("+" if difference > 0 else "") + sci(difference)
        table.add_row(*(Text(visible(cell)) for cell in (
            mode, sci(c.get("eager_rel_error")), sci(c.get("compiled_rel_error")), shown,
            sci(c.get("compiled_vs_eager")), sci(c.get("emulated_casts_rel_error")))))
    console.print()
    console.print(table)


def _share(share) -> str:
    """A contribution: signed (an error can cancel part of the others), 0% below a twentieth of a percent."""
    if share is None:
        return "n/a"
    if abs(share) < 0.0005:
        return "0%"
    return ("-" if share < 0 else "") + percent(abs(share))


def _ledger_row(row, m) -> list:
    name = row.get("label") or (row["module"] if row["op"].startswith("nn.") and row["module"] else (
        f"{row['op']} in {row['module']}" if row["module"] else row["op"]))
    location = row.get("location")
    where = f"{location['path'].rsplit('/', 1)[-1]}:{location['line']}" if location else ""
    flags = []
    if m.get("tf32_applied") is not None:
        flags.append("TF32" if m["tf32_applied"] else "fp32 kernel")
    if m.get("nonfinite"):
        flags.append("inf/NaN")
    if m.get("flips") is not None:
        flags.append(f"flips {m['flips']}/{m['units']}")
    cells = [name, where, m.get("dtype") or "", sci((m.get("local") or {}).get("rel_error")),
             sci((m.get("received") or {}).get("rel_error")) if not m.get("nonfinite") else "inf/NaN",
             sci(m.get("amplification")), _share(m.get("contribution")), ", ".join(flags)]
    return [Text(visible(cell)) for cell in cells]  # a Table parses str cells as markup


def _ledger_tables(console: Console, report: Report) -> None:
    """`preclint probe`: per mode, every node that adds error (with --top N, the N with the largest
    share), with what reaches it and its share; then what the shares add up to."""
    top = report.ledger_top
    legend = False
    for mode in report.precisions:
        measured = ranked_ledger(report.ledger, mode)
        if top is None:  # execution order
            order = {id(row): i for i, row in enumerate(report.ledger)}
            measured.sort(key=lambda row: order[id(row)])
        shares = [row["modes"][mode].get("contribution") for row in measured]
        adding = [row for row in measured if _adds_error(row["modes"][mode])]
        shown = adding[:top] if top is not None else adding
        if not shown:
            continue
        console.print()
        title = f"Measured per layer under {mode}" + (f": the {len(shown)} largest shares" if top is not None else "")
        table = Table(title=title, title_justify="left", show_edge=False)
        for column, justify in (("layer", "left"), ("where", "left"), ("dtype", "left"), ("local", "right"),
                                ("received", "right"), ("amplification", "right"), ("share", "right"), ("", "left")):
            table.add_column(column, justify=justify)
        for row in shown:
            table.add_row(*_ledger_row(row, row["modes"][mode]))
        console.print(table)
        total = sum(s for s in shares if s is not None)
        if any(s is not None for s in shares):
            legend = True
            held = sum(row["modes"][mode].get("contribution") or 0.0 for row in shown)
            text = f"{mode}: the shares of all {len(measured)} nodes add up to {_share(total)} of the measured output error"
            if len(shown) < len(adding) or len(adding) < len(measured):
                text += f"; the {len(shown)} shown hold {_share(held)}"
            console.print(Text(text + ".", style="dim"))
        hidden = len(measured) - len(shown)
        if hidden:
            why = f"--top {top}" if top is not None else "they add no error and hold no share"
            console.print(Text(f"{hidden} more nodes are not shown ({why}; without --top, --output-format json "
                               "lists every node).", style="dim"))
    if legend:
        console.print(Text("share: a node's part of the measured output error E, <J e, E>/|E|^2, with e the error it "
                           "adds itself and J how the layers after it carry e to the output; the shares add up to the "
                           "part of E this first-order account explains. A negative share is an error that partly "
                           "cancels the others' at the output (the same sign as --ablate's exact one-node runs give).",
                           style="dim"))


def _adds_error(m) -> bool:
    return bool((m.get("local") or {}).get("rel_error") or m.get("contribution") or m.get("flips") or m.get("nonfinite"))


def render(report: Report, color: bool = False, width: int = 110) -> str:
    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False, soft_wrap=False)
    findings = report.sorted_findings()
    if report.model:
        console.print(Text.assemble(("preclint ", "bold"), visible(f"{report.model} (captured with {report.capture}; "
                                                           f"precisions {', '.join(report.precisions)})")))
    for path, group in groupby(findings, key=lambda f: f.location.path if f.location else ""):
        console.print()
        console.print(Text(visible(path) or "(model)", style="bold underline"))
        for f in group:
            where = f"{f.location.line}:{f.location.column}" if f.location else "-"
            status = "refuted by the probe " if is_refuted(f) else (f"{f.status} " if f.status else "")
            style = "dim" if is_refuted(f) else _SEVERITY_STYLE.get(f.severity, "")
            head = Text.assemble(f"  {where} ", (f.code, style), f" [{f.severity}] ", status, visible(f.message))
            console.print(head)
            figures = _figure_line(f)
            if figures:
                console.print(Text(f"      relative error: {figures}", style="dim"))
            for loc, text in f.related:
                console.print(Text(visible(f"      note: {loc.path}:{loc.line}: {text}"), style="dim"))
            console.print(Text(f"      help: {visible(f.fix)}", style="green"))
    if report.summary:
        console.print()
        table = Table(title="Predicted output error", title_justify="left", show_edge=False)
        table.add_column("precision")
        several = any(entry.get("outputs") for entry in report.summary.values())
        if several:  # one row per output: each error relative to that output's own values
            # (each name shortened from its middle, where long, so that two outputs never read alike)
            labels = output_labels(sorted({f["output"] for e in report.summary.values() for f in e.get("outputs") or ()}))
            table.add_column("output", no_wrap=True, min_width=max(map(len, labels.values()), default=6))
        table.add_column("relative RMS", justify="right")
        table.add_column("max abs", justify="right")
        table.add_column("finite")
        measured = any("measured_output" in e for e in report.summary.values())
        if measured:
            table.add_column("measured rel RMS", justify="right")
        table.add_column("layers contributing most" + (" (all outputs)" if several else ""))
        for mode, entry in report.summary.items():
            out = entry["predicted_output"]
            layers = ", ".join(f"{t['module']} {percent(t['share'])}" for t in entry.get("top_layers", [])[:3])
            for i, figure in enumerate(entry.get("outputs") or [dict(out, output="all")]):
                row = [mode if i == 0 else ""] + ([labels.get(figure["output"], figure["output"])] if several else [])
                rel = sci(figure["rel_error"])
                if entry.get("if_float32_kernels") and not several:  # tf32: the backend's kernels in float32
                    other = entry["if_float32_kernels"]["rel_error"]  # (predict/kernel_cases.py)
                    rel += f" ({sci(other) if other else 'float32-sized'} if float32 kernels)"
                row += [rel, sci(figure["max_abs_error"]),
                        "n/a" if figure["finite"] is None else ("yes" if figure["finite"] else "NO")]
                if measured:
                    row.append(_measured_cell(entry, i if several else None))
                row.append((layers or "-") if i == 0 else "")
                table.add_row(*(Text(visible(cell)) for cell in row))
        console.print(table)
        _compiled_table(console, report)
        training_table(console, report.summary)
    if report.ledger:
        _ledger_tables(console, report)
    for caveat in report.caveats:
        console.print(Text(f"warning: {visible(caveat)}", style="yellow"))
    for note in report.notes:
        console.print(Text(f"note: {visible(note.text)}", style="dim"))
    standing = [f for f in findings if not is_refuted(f)]
    counts = {s: sum(1 for f in standing if f.severity == s) for s in ("error", "warning", "info")}
    total = len(findings)
    refuted = total - len(standing)
    console.print()
    if total:
        console.print(f"Found {total} finding{'s' if total != 1 else ''} "
                      f"({counts['error']} error, {counts['warning']} warning, {counts['info']} info"
                      + (f"; {refuted} refuted by the probe, which do not fail the check)." if refuted else ")."))
    else:
        console.print("No findings.")
    return log_lines(buffer.getvalue())  # a long name wrapped onto a line of its own may begin with "::"


def render_many(reports: Sequence[Report], color: bool = False) -> str:
    """Each checked model's report; a closing line names the models that could not be checked (their
    errors are on stderr). Nothing when no model was checked."""
    checked = [r for r in reports if r.error is None]
    if not checked:
        return ""
    text = "".join(render(r, color=color) for r in checked)
    failed = [visible(r.model or "a model") for r in reports if r.error is not None]
    if failed:
        text += log_lines(f"{len(failed)} model{'s' if len(failed) != 1 else ''} could not be checked: "
                          f"{', '.join(failed)}.\n")
    return text
