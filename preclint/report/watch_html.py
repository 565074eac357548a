"""A page of charts over the steps of a watched run (``preclint.watch``'s JSON lines): the flushed
gradients, the weights with a zero gradient and the lost updates per sampled step, the loss scale with
GradScaler's skips, and per layer the flushed gradients and lost updates of the layers that have most.

    preclint.watch_report("precision.jsonl", "precision.html")

One self-contained file (plotly.js inlined, as the check's HTML report); module paths are escaped as
chart labels and page text. Its ids and its script carry the page's own prefix (report/page_scope.py),
so it shares a notebook or a page with other reports without drawing into them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Union

from preclint.core.errors import UserError
from preclint.report.escape import chart_label, html_text
from preclint.report.html import plotly_js
from preclint.report.page_scope import placeholder, prefix_of

LAYERS_SHOWN = 8  # per chart: the layers whose largest figure over the run is largest


def _script_data(data) -> str:
    """JSON that is safe inside <script>: no "</" can close the element early (as html.py writes its data)."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def read_records(path: Union[str, Path]) -> List[Dict[str, Any]]:
    records = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise UserError(f"{path}: cannot read it ({error.strerror or error})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise UserError(f"{path}:{number}: not a JSON line of preclint.watch ({error.msg})") from None
    return records


def _line(x: Sequence[Any], y: Sequence[Any], name: str) -> Dict[str, Any]:
    return dict(type="scatter", mode="lines+markers", x=list(x), y=list(y), name=chart_label(name))


def _value(layer: Dict[str, Any], figure: str, kind: str = "", operand: str = ""):
    """A layer's ``figure``, or (``kind``: "scales", "delayed") that of one operand's recipe statistics."""
    return layer.get(kind, {}).get(operand, {}).get(figure) if kind else layer.get(figure)


def _layer_traces(records: List[Dict[str, Any]], figure: str, kind: str = "") -> List[Dict[str, Any]]:
    """The layers (with ``kind``: layer and operand) whose ``figure`` peaks highest, one line each."""
    peaks: Dict[tuple, float] = {}
    for record in records:
        for path, layer in record.get("layers", {}).items():
            for operand in (layer.get(kind, {}) if kind else [""]):
                value = _value(layer, figure, kind, operand)
                if value is not None:
                    peaks[path, operand] = max(peaks.get((path, operand), 0.0), value)
    shown = sorted((p for p in peaks if peaks[p] > 0), key=lambda p: -peaks[p])[:LAYERS_SHOWN]
    steps = [r["step"] for r in records]
    return [_line(steps, [_value(r.get("layers", {}).get(path, {}), figure, kind, operand) for r in records],
                  f"{path or '(model)'} {operand}".strip()) for path, operand in shown]


def charts(records: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    steps = [r["step"] for r in records]
    totals = [r.get("totals", {}) for r in records]
    found = [dict(title="Per sampled step: fraction of the whole model", traces=[
        _line(steps, [t.get("underflow_fraction") for t in totals], "flushed gradients (GEMMs)"),
        _line(steps, [t.get("zero_gradient_fraction") for t in totals], "weights with a zero gradient"),
        _line(steps, [t.get("lost_update_fraction") for t in totals], "lost updates")], log=False)]
    scales = [r.get("scale") for r in records]
    if any(s is not None for s in scales):
        skips = [s for r in records for s in r.get("skips", [])]
        found.append(dict(title="Loss scale (GradScaler) and skipped steps", log=True, traces=[
            _line(steps, scales, "loss scale"),
            dict(type="scatter", mode="markers", x=[s["step"] for s in skips], y=[s["scale"] for s in skips],
                 name="skipped step", marker=dict(symbol="x", size=9))]))
    for figure, title in (("underflow_fraction", "Flushed gradients per layer"),
                          ("lost_update_fraction", "Lost updates per layer")):
        traces = _layer_traces(records, figure)
        if traces:
            found.append(dict(title=f"{title} (the {len(traces)} with most)", traces=traces, log=False))
    # the scaled layers' recipe statistics (watch_scaled.py), per layer and operand
    for kind, figure, title in (("delayed", "saturated_fraction", "Delayed scaling: values the stale scale saturates"),
                                ("delayed", "underflow_fraction", "Delayed scaling: values the stale scale flushes"),
                                ("scales", "underflow_fraction", "NVFP4 block scales: values flushed"),
                                ("scales", "saturated_fraction", "NVFP4 block scales: values saturated")):
        traces = _layer_traces(records, figure, kind)
        if traces:
            found.append(dict(title=f"{title} (the {len(traces)} with most)", traces=traces, log=False))
    return found


def _jumps(records: List[Dict[str, Any]]) -> str:
    """Delayed scaling's amax jumps: the steps whose amax outran the history's scale."""
    rows = [f"<tr><td>{j['step']}</td><td>{html_text(j['layer'] or '(model)')}</td><td>{html_text(j['operand'])}</td>"
            f"<td>{j['amax']:.4g}</td><td>{j['history_amax']:.4g}</td></tr>"
            for record in records for j in record.get("amax_jumps", []) if j.get("amax") is not None
            and j.get("history_amax") is not None]
    if not rows:
        return ""
    return ("<h2>Delayed scaling: amax jumps</h2><p>Steps whose amax, at the scale its history gave, lies beyond "
            "the element's largest value: the values above the history's amax saturate.</p><table><tr><th>step</th>"
            "<th>layer</th><th>operand</th><th>amax</th><th>history's amax</th></tr>" + "".join(rows) + "</table>")


def _events(records: List[Dict[str, Any]]) -> str:
    rows = []
    for record in records:
        for key, what in (("first_nonfinite_forward", "forward"), ("first_nonfinite_backward", "backward"),
                          ("first_nonfinite_update", "update")):
            if record.get(key):
                rows.append(f"<tr><td>{record['step']}</td><td>{what}</td><td><code>{html_text(record[key])}</code></td></tr>")
    if not rows:
        return "<p>No inf or NaN on the sampled steps.</p>"
    return "<table><tr><th>step</th><th>first non-finite in</th><th>module or parameter</th></tr>" + "".join(rows) + "</table>"


def render(records: List[Dict[str, Any]]) -> str:
    if not records:
        raise UserError("preclint.watch_report: no records (did the run reach a sampled step?)")
    data = charts(records)
    scope = placeholder()
    divs = "\n".join(f'<div id="{scope}-chart{i}" style="height:360px"></div>' for i in range(len(data)))
    # the page's own plotly.js (the one just before it) and the first root of its id not drawn yet
    script = f"""
(function (rootId, charts) {{
  const Plotly = window.Plotly;
  const root = Array.from(document.querySelectorAll("[id='" + rootId + "']")).find(el => !el.dataset.drawn);
  if (!root) return;
  root.dataset.drawn = "1";
  charts.forEach((c, i) => Plotly.newPlot(root.querySelector("[id='" + rootId + "-chart" + i + "']"), c.traces,
    {{title: {{text: c.title}}, xaxis: {{title: {{text: "step"}}}}, yaxis: {{type: c.log ? "log" : "linear"}}, margin: {{t: 40}}}},
    {{displaylogo: false, responsive: true}}));
}})({_script_data(scope)}, {_script_data(data)});
"""
    last = records[-1]
    head = (f"<h1>preclint.watch</h1><p>{len(records)} sampled steps, the last {last['step']}; "
            f"autocast {html_text(str(last.get('autocast')))}; world size {last.get('world_size', 1)}.</p>")
    body = (f"</head><body><div class='preclint-watch' id='{scope}'>{head}{divs}<h2>Non-finite values</h2>"
            f"{_events(records)}{_jumps(records)}<script>{script}</script></div></body></html>\n")
    prefix = prefix_of((body,), scope)
    return ("<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>preclint.watch</title>"
            f"<script>{plotly_js()}</script>" + body.replace(scope, prefix))


def watch_report(records: Union[str, Path, List[Dict[str, Any]]], out: Union[str, Path]) -> Path:
    """Write the charts of a watched run (its JSON lines file, or ``Watch.records``) to ``out``."""
    if isinstance(records, (str, Path)):
        records = read_records(records)
    out = Path(out)
    out.write_text(render(records), encoding="utf-8")
    return out
