"""--output-format html: one self-contained page that opens offline, with the numbers as pictures.

The page holds, per model: the header (model, capture, precisions, tolerance, environment record),
the output error per precision against the tolerance, the error along the model in execution order
(local, received and share of the output error, predicted and measured, findings marked), the top
contributors, an optional plan section, and every finding with its source lines, numbers and fix.
Charts are drawn by plotly.js, inlined from the installed plotly package: the file needs no network.

The page holds its own styles and scripts, and every id in it carries one prefix (report/page_scope.py):
two reports in one document, as two outputs of a Jupyter notebook are, never draw into each other.

Large models stay readable: the chart along the model shows modules, aggregated, and a click on one
expands it into its children (local and received: the largest of its nodes; share: their sum).

The data the charts read is prepared in report/html_data.py; this module writes the page around it.

A command with a plan to show (``preclint plan``) passes it as a :class:`PlanSection`::

    render_many(reports, plan=PlanSection("what it found", ["layer", "dtype"], rows, chart))
"""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from preclint import __version__
from preclint.core.errors import UserError
from preclint.core.findings import Finding, Location, percent, sci
from preclint.report.escape import html_text as _e
from preclint.report.document import Report, failure_line, is_refuted
from preclint.report.html_data import chart_nodes, finding_refs, output_errors, source_snippet, top_contributors
from preclint.report.page_scope import placeholder, prefix_of, scoped_css


@dataclass
class PlanSection:
    """A plan as the page shows it: a paragraph, a table and at most one chart.

    ``chart``: ``{"x": [labels], "series": {name: [numbers]}, "y_title": str, "log": bool}``, drawn as
    lines over the labels (None where a series has no value)."""

    summary: str
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]
    chart: Optional[Dict[str, Any]] = None
    heading: str = "Plan"


def plotly_js() -> str:
    """plotly.js as the installed plotly package ships it (found without importing plotly)."""
    spec = importlib.util.find_spec("plotly")
    bundle = None
    if spec is not None and spec.submodule_search_locations:
        bundle = Path(list(spec.submodule_search_locations)[0]) / "package_data" / "plotly.min.js"
    if bundle is None or not bundle.is_file():
        raise UserError("--output-format html draws its charts with plotly: pip install plotly (a dependency of preclint)")
    return bundle.read_text(encoding="utf-8")


def _script_json(data) -> str:
    """JSON that is safe inside <script>: no "</" can close the element early."""
    text = json.dumps(data, separators=(",", ":"), allow_nan=False, sort_keys=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _place(location: Optional[Location]) -> str:
    if location is None:
        return "(model)"
    return f"{location.path}:{location.line}:{location.column}" + (" (library)" if location.library else "")

# ---- the page ------------------------------------------------------------------------------------


def _header(report: Report) -> str:
    items = [("capture", report.capture or "n/a"), ("precisions", ", ".join(report.precisions) or "n/a")]
    if report.tolerance:
        items.append(("tolerance", ", ".join(f"{k} {sci(v)}" for k, v in report.tolerance.items() if v is not None)))
    else:
        items.append(("tolerance", "none given (--rtol/--atol)"))
    out = ["<dl class='facts'>"] + [f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in items] + ["</dl>"]
    env = report.environment
    if env:
        flags = env.get("flags", {})
        plain = [(k, v) for k, v in env.items() if k != "flags"]
        out.append("<details class='env'><summary>Environment: " + _e(_env_line(env)) + "</summary><table>")
        out += [f"<tr><th>{_e(k)}</th><td>{_e(_env_value(v))}</td></tr>" for k, v in plain]
        out += [f"<tr><th><code>{_e(k)}</code></th><td>{_e(v)}</td></tr>" for k, v in flags.items()]
        out.append("</table></details>")
    return "\n".join(out)


def _env_line(env: Dict[str, Any]) -> str:
    parts = [f"torch {env.get('torch')}"]
    if env.get("gpu"):
        parts.append(f"{env['gpu']} (CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')})")
    elif env.get("cpu"):
        parts.append(f"CPU {env['cpu']}" + (", emulated" if env.get("emulated") else ""))
    return "; ".join(parts)


def _env_value(value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    return "n/a" if value is None else str(value)


def _output_table(report: Report) -> str:
    measured = any("measured_output" in e for e in report.summary.values())
    head = "<tr><th>precision</th><th>predicted rel. RMS</th><th>predicted max abs</th><th>finite</th>"
    head += "<th>measured rel. RMS</th><th>measured max abs</th><th>smallest passing rtol</th>" if measured else ""
    rows = [head + "</tr>"]
    for mode in report.precisions:
        entry = report.summary.get(mode, {})
        p = entry.get("predicted_output", {})
        finite = "n/a" if p.get("finite") is None else ("yes" if p.get("finite") else "NO")
        cells = [mode, sci(p.get("rel_error")), sci(p.get("max_abs_error")), finite]
        if measured:
            m = entry.get("measured_output") or {}
            if "error" in m:
                cells += [f"not measured: {m['error']}", "", ""]
            else:
                rel = "inf/NaN" if m.get("finite") is False else sci(m.get("rel_error"))
                cells += [rel, sci(m.get("max_abs_error")), sci(m.get("min_rtol")) if "min_rtol" in m else "n/a"]
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return "<table class='numbers'>" + "".join(rows) + "</table>"


def _figures(f: Finding) -> str:
    modes = sorted(set(f.predicted) | set(f.measured))
    if not modes:
        return ""
    rows = ["<tr><th>precision</th><th>predicted rel. error</th><th>predicted max abs</th>"
            "<th>measured rel. error</th><th>measured max abs</th><th>status</th></tr>"]
    for mode in modes:
        p, m = f.predicted.get(mode), f.measured.get(mode)
        cells = [mode]
        for figure in (p, m):
            if figure is None:
                cells += ["", ""]
                continue
            rel = sci(figure.rel_error)
            if figure.flip_fraction is not None:
                rel += f" (flips {percent(figure.flip_fraction)})"
            cells += [rel, sci(figure.max_abs_error)]
        cells.append((m.status if m is not None and m.status else "") or "")
        rows.append("<tr>" + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return "<table class='numbers'>" + "".join(rows) + "</table>"


def _finding_card(f: Finding, anchor: str, on_chart: bool) -> str:
    status = "refuted by the probe" if is_refuted(f) else (f.status or "")
    classes = f"finding {f.severity}" + (" refuted" if is_refuted(f) else "")
    out = [f"<article class='{classes}' id='{anchor}'>",
           f"<h3><span class='code'>{_e(f.code)}</span> {_e(f.name)} <span class='sev'>{_e(f.severity)}</span>"
           + (f" <span class='status'>{_e(status)}</span>" if status else "") + "</h3>",
           f"<p class='where'>{_e(_place(f.location))}" + (f" &middot; {_e(f.module)}" if f.module else "")
           + (f" &middot; <code>{_e(f.op)}</code>" if f.op else "")
           + (" &middot; <a href='#' class='show-node' data-anchor='" + _e(anchor) + "'>show on the chart</a>"
              if on_chart else "") + "</p>",
           f"<p class='message'>{_e(f.message)}</p>"]
    snippet = source_snippet(f.location)
    if snippet:
        lines = []
        for k, text in enumerate(snippet["lines"]):
            number = snippet["first"] + k
            mark = " class='hit'" if number == snippet["line"] else ""
            lines.append(f"<span{mark}><i>{number:>5}</i> {_e(text)}</span>")
        out.append("<pre class='snippet'>" + "\n".join(lines) + "</pre>")
    out.append(_figures(f))
    for loc, text in f.related:
        out.append(f"<p class='related'>note: {_e(_place(loc))}: {_e(text)}</p>")
    out.append(f"<p class='fix'><b>Fix:</b> {_e(f.fix)}</p></article>")
    return "\n".join(out)


def _plan(plan: PlanSection, anchor: str) -> str:
    out = [f"<section><h2>{_e(plan.heading)}</h2>", f"<p>{_e(plan.summary)}</p>"]
    if plan.chart:
        out.append(f"<div class='chart' id='{anchor}-plan' data-chart='plan'></div>")
    out.append("<table class='numbers'><tr>" + "".join(f"<th>{_e(c)}</th>" for c in plan.columns) + "</tr>")
    for row in plan.rows:
        out.append("<tr>" + "".join(f"<td>{_e(sci(c) if isinstance(c, float) else c)}</td>" for c in row) + "</tr>")
    out.append("</table></section>")
    return "\n".join(out)


def _report_section(report: Report, anchor: str, plan: Optional[PlanSection]) -> str:
    title = f"<h1>preclint: {_e(report.model or 'source check')}</h1>"
    if report.error is not None:
        return f"<section class='model'>{title}<p class='error'>{_e(failure_line(report))}</p></section>"
    findings = report.sorted_findings()
    nodes = chart_nodes(report)
    refs = finding_refs(findings, nodes, anchor)
    on_chart = {ref["id"] for refs_ in refs.values() for ref in refs_}
    data = {"anchor": anchor, "precisions": list(report.precisions), "tolerance": report.tolerance,
            "outputs": output_errors(report), "nodes": nodes, "findings": refs, "top": top_contributors(report, nodes),
            "plan": plan.chart if plan is not None else None}
    out = [f"<section class='model' id='{anchor}'>", title, _header(report)]
    for caveat in report.caveats:
        out.append(f"<p class='caveat'>warning: {_e(caveat)}</p>")
    if report.summary:
        out += ["<h2>Output error per precision</h2>", f"<div class='chart small' id='{anchor}-outputs'></div>",
                _output_table(report)]
    if nodes["names"]:
        count = len(nodes["names"])
        out += ["<h2>Error along the model</h2>",
                f"<p class='help'>{count} nodes in execution order. Modules are shown aggregated: click one to expand "
                "it (local and received: the largest of its nodes; share: their sum). A click on a marked finding "
                "opens it. Relative RMS errors and shares of the output error, log scale"
                + (", predicted (solid) and measured (dotted)." if nodes["measured"] else ", predicted.") + "</p>",
                f"<div class='controls' id='{anchor}-controls'></div>",
                f"<div class='chart tall' id='{anchor}-along'></div>",
                "<h2>Top contributors to the output error</h2>",
                f"<div class='chart' id='{anchor}-top'></div>"]
    if plan is not None:
        out.append(_plan(plan, anchor))
    out.append(f"<h2>Findings ({len(findings)})</h2>")
    if not findings:
        out.append("<p>No findings.</p>")
    out += [_finding_card(f, f"{anchor}-f{i}", f"{anchor}-f{i}" in on_chart) for i, f in enumerate(findings)]
    if report.notes:
        out.append("<h2>Notes</h2><ul class='notes'>" + "".join(f"<li>{_e(n.text)}</li>" for n in report.notes) + "</ul>")
    out.append(f"<script type='application/json' class='report-data'>{_script_json(data)}</script></section>")
    return "\n".join(out)


def render(report: Report, plan: Optional[PlanSection] = None) -> str:
    return render_many([report], plan)


def render_many(reports: Sequence[Report], plan: Optional[PlanSection] = None, *, side_by_side: bool = False) -> str:
    """One page for the run: a section per model (the plan, if any, in the first); ``side_by_side``:
    the plan's section across the top and the models' sections in two columns below (`diff`).

    Everything the page shows sits in one root element whose id is the page's prefix; the ids, the
    style rules and the script all carry it (report/page_scope.py)."""
    title = ", ".join(r.model for r in reports if r.model) or "source check"
    scope = placeholder()
    if side_by_side:
        lead = [] if plan is None else [
            f"<section class='model' id='{scope}-lead'>" + _plan(plan, f"{scope}-lead") + "<script type='application/json' "
            f"class='report-data'>{_script_json({'anchor': f'{scope}-lead', 'outputs': [], 'nodes': {'names': []}, 'plan': plan.chart})}"
            "</script></section>"]
        sections = lead + ["<div class='side'>" + "\n".join(_report_section(r, f"{scope}-m{k}", None)
                                                            for k, r in enumerate(reports)) + "</div>"]
    else:
        sections = [_report_section(r, f"{scope}-m{k}", plan if k == 0 else None) for k, r in enumerate(reports)]
    head = (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width, initial-scale=1'>"
            f"<meta name='generator' content='preclint {_e(__version__)}'>"
            f"<title>preclint: {_e(title)}</title><style>{scoped_css(_CSS, scope)}</style>")
    body = (f"</head><body>\n<div class='preclint' id='{scope}'>\n" + "\n".join(sections)
            + f"\n<footer>preclint {_e(__version__)}</footer><script>{_JS}({_script_json(scope)});</script></div>"
            "</body></html>\n")
    prefix = prefix_of((head, body), scope)
    return head.replace(scope, prefix) + f"<script>{plotly_js()}</script>" + body.replace(scope, prefix)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1200px;padding:12px 24px;color:#1d2330}
h1{font-size:22px;margin:8px 0}h2{font-size:17px;margin:26px 0 6px;border-bottom:1px solid #dde}h3{font-size:15px;margin:0 0 4px}
.facts{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:6px 0}.facts dt{color:#667}.facts dd{margin:0}
.env table,.numbers{border-collapse:collapse;margin:6px 0}.env th,.env td,.numbers th,.numbers td{border:1px solid #dde;padding:2px 8px;text-align:left}
.numbers td{font-variant-numeric:tabular-nums}.chart{width:100%;height:340px}.chart.small{height:220px}.chart.tall{height:560px}
.controls{display:flex;gap:10px;align-items:center;flex-wrap:wrap;margin:4px 0}.controls button{font:inherit;padding:2px 10px}
.help{color:#556;font-size:13px}.finding{border:1px solid #dde;border-left:5px solid #999;border-radius:4px;padding:8px 12px;margin:10px 0}
.finding.error{border-left-color:#c62828}.finding.warning{border-left-color:#e0a100}.finding.info{border-left-color:#1e88e5}
.finding.refuted{opacity:.65}.finding:target{box-shadow:0 0 0 3px #7aa7ff}.code{font-family:monospace;font-weight:700}
.sev,.status{font-size:12px;font-weight:400;border-radius:3px;padding:0 6px;background:#eef}.where{color:#556;margin:0}
.snippet{background:#f6f7f9;border:1px solid #e3e5ea;padding:6px;overflow-x:auto;font-size:12.5px}
.snippet i{color:#99a;font-style:normal}.snippet .hit{background:#fff1b8;display:inline-block;min-width:100%}
.side{display:grid;grid-template-columns:1fr 1fr;gap:18px}.side>section{min-width:0}
.fix{color:#1b5e20}.caveat,.error{color:#b3261e;font-weight:600}.related{color:#556;margin:2px 0}footer{color:#99a;margin:30px 0 10px}
"""

# The charts. Plotly draws them; this script only shapes the data: the visible items along the model
# (a module aggregated, or a node), their values per precision, and what a click does. It is called
# with the page's root id and reaches only what that root holds, with the plotly.js of its own page
# (the one that ran just before it: a later page in the same document replaces window.Plotly).
_JS = r"""
(function (rootId) {
  "use strict";
  const Plotly = window.Plotly;
  // the first root of this id not drawn yet: the same report shown twice holds the same ids twice
  const root = Array.from(document.querySelectorAll("[id='" + rootId + "']")).find(el => !el.dataset.drawn);
  if (!root) return;
  root.dataset.drawn = "1";
  function byId(id) { return root.querySelector("[id='" + id + "']"); }
  const LOG_FLOOR = 1e-12;
  const COLORS = {local: "#1f77b4", received: "#ff7f0e", share: "#2ca02c", finding: "#d62728"};
  const config = {responsive: true, displaylogo: false};
  function prefixes(module) {
    const parts = module ? module.split(".") : [];
    return parts.map((_, i) => parts.slice(0, i + 1).join("."));
  }
  // a log axis shows magnitudes; a zero (a node that adds no error) is left out rather than drawn at a floor
  function positive(v) { return v === null || v === undefined || v === 0 ? null : Math.abs(v); }
  function fmt(v) { return v === null || v === undefined ? "n/a" : Math.abs(v) >= 1e-3 && Math.abs(v) < 1e4 ? v.toPrecision(3) : v.toExponential(2); }

  function outputsChart(data) {
    const el = byId(data.anchor + "-outputs");
    if (!el) return;
    const modes = data.outputs.map(o => o.mode);
    const traces = [{type: "bar", orientation: "h", name: "predicted", y: modes, x: data.outputs.map(o => positive(o.predicted)),
                     marker: {color: COLORS.local}, hovertemplate: "%{y} predicted %{x:.3g}<extra></extra>"}];
    if (data.outputs.some(o => o.measured !== null || o.measured_finite !== null)) {
      traces.push({type: "bar", orientation: "h", name: "measured", y: modes, x: data.outputs.map(o => positive(o.measured)),
                   marker: {color: COLORS.received}, hovertemplate: "%{y} measured %{x:.3g}<extra></extra>"});
    }
    const annotations = [];
    data.outputs.forEach(o => {
      if (o.predicted_finite === false || o.measured_finite === false) {
        annotations.push({xref: "paper", x: 0.01, xanchor: "left", y: o.mode, showarrow: false, font: {color: COLORS.finding},
                          text: "inf/NaN " + (o.predicted_finite === false ? "predicted" : "") +
                                (o.predicted_finite === false && o.measured_finite === false ? " and " : "") +
                                (o.measured_finite === false ? "measured" : "")});
      }
    });
    const shapes = [];
    if (data.tolerance && data.tolerance.rtol) {
      shapes.push({type: "line", xref: "x", yref: "paper", x0: data.tolerance.rtol, x1: data.tolerance.rtol, y0: 0, y1: 1,
                   line: {color: COLORS.finding, dash: "dash"}});
    }
    const layout = {barmode: "group", margin: {l: 90, r: 20, t: 10, b: 40}, shapes: shapes, annotations: annotations,
                    xaxis: {type: "log", title: {text: "relative RMS error of the output" + (shapes.length ? " (dashed: rtol)" : "")}},
                    yaxis: {autorange: "reversed"}, legend: {orientation: "h", y: -0.3}};
    Plotly.newPlot(el, traces, layout, config);
  }

  function AlongChart(data) {
    const nodes = data.nodes, n = nodes.names.length;
    this.data = data;
    this.el = byId(data.anchor + "-along");
    this.mode = data.precisions[0];
    this.expanded = new Set();
    this.opened = [];  // the modules a click expanded, last last: what "collapse the last expanded" closes
    this.findingAt = data.findings;
    // expand level by level while the chart stays readable
    const all = new Set();
    nodes.modules.forEach(m => prefixes(m).forEach(p => all.add(p)));
    this.allPrefixes = all;
    for (let depth = 1; depth < 64; depth++) {
      const level = [...all].filter(p => p.split(".").length === depth);
      if (!level.length) break;
      const trial = new Set([...this.expanded, ...level]);
      if (this.items(trial).length > 160 && this.expanded.size + level.length > 0 && n > 160) break;
      level.forEach(p => this.expanded.add(p));
    }
    this.controls();
    this.draw();
  }
  AlongChart.prototype.items = function (expanded) {
    const nodes = this.data.nodes, byKey = new Map(), items = [];
    for (let i = 0; i < nodes.names.length; i++) {
      const key = prefixes(nodes.modules[i]).find(p => !expanded.has(p));
      const id = key === undefined ? "#" + i : key;
      let item = byKey.get(id);
      if (!item) {
        item = {id: id, group: key !== undefined, label: key !== undefined ? key : nodes.labels[i], members: []};
        byKey.set(id, item);
        items.push(item);
      }
      item.members.push(i);
    }
    return items;
  };
  AlongChart.prototype.values = function (item, column, sum) {
    const s = this.data.nodes.series[this.mode][column];
    let out = null;
    for (const i of item.members) {
      const v = s[i];
      if (v === null) continue;
      out = out === null ? v : (sum ? out + v : Math.max(out, v));
    }
    return out;
  };
  AlongChart.prototype.controls = function () {
    const box = byId(this.data.anchor + "-controls");
    const self = this;
    const select = document.createElement("select");
    this.data.precisions.forEach(m => { const o = document.createElement("option"); o.value = m; o.textContent = m; select.appendChild(o); });
    select.onchange = () => { self.mode = select.value; self.draw(); };
    const label = document.createElement("label"); label.textContent = "precision ";
    label.appendChild(select);
    box.appendChild(label);
    [["expand all", () => { self.expanded = new Set(self.allPrefixes); }],
     ["collapse all", () => { self.expanded = new Set(); }],
     ["collapse the last expanded", () => {
       const last = self.opened.pop();
       if (last !== undefined) [...self.expanded].filter(p => p === last || p.startsWith(last + ".")).forEach(p => self.expanded.delete(p));
     }]].forEach(([text, act]) => {
      const b = document.createElement("button"); b.textContent = text;
      b.onclick = () => { act(); self.draw(); };
      box.appendChild(b);
    });
    this.status = document.createElement("span"); this.status.className = "help";
    box.appendChild(this.status);
  };
  AlongChart.prototype.draw = function () {
    const items = this.items(this.expanded);
    this.shown = items;
    const x = items.map((_, k) => k);
    const text = items.map(it => it.label + (it.group ? " (" + it.members.length + " nodes, click to expand)" : ""));
    const measured = this.data.nodes.measured;
    const traces = [];
    // received is a path through the model (a line); local and share belong to each node (markers)
    const series = [["local", "pl", "ml", false, "markers"], ["received", "pr", "mr", false, "lines"],
                    ["share", "ps", "ms", true, "markers"]];
    const type = items.length > 1500 ? "scattergl" : "scatter";
    for (const [name, p, m, sum, mode] of series) {
      const yaxis = name === "share" ? "y2" : "y";
      const kinds = measured ? [["predicted", p, "solid", "circle"], ["measured", m, "dot", "diamond-open"]]
                             : [["predicted", p, "solid", "circle"]];
      for (const [kind, column, dash, symbol] of kinds) {
        const raw = items.map(it => this.values(it, column, sum));
        traces.push({type: type, mode: mode, name: name + ", " + kind, x: x, y: raw.map(positive), customdata: raw.map(fmt),
                     text: text, yaxis: yaxis, line: {color: COLORS[name], dash: dash, width: 1.5},
                     marker: {size: 6, symbol: symbol, color: COLORS[name]}, connectgaps: false,
                     hovertemplate: "%{text}<br>" + name + " " + kind + ": %{customdata}<extra></extra>"});
      }
    }
    const fx = [], fy = [], ftext = [], fid = [];
    items.forEach((it, k) => {
      const refs = [];
      // the findings about this precision (a finding that names none is about every one)
      it.members.forEach(i => (this.findingAt[i] || []).forEach(r => {
        if (!r.modes.length || r.modes.includes(this.mode)) refs.push(r);
      }));
      if (!refs.length) return;
      const y = Math.max(...["pl", "pr", "ml", "mr"].map(c => positive(this.values(it, c, false)) || LOG_FLOOR));
      fx.push(k); fy.push(y); fid.push(refs[0].id);
      ftext.push(refs.map(r => r.code + " (" + r.severity + (r.status ? ", " + r.status : "") + ")").join(", "));
    });
    traces.push({type: "scatter", mode: "markers", name: "findings", x: fx, y: fy, customdata: fid, text: ftext,
                 marker: {symbol: "x", size: 11, color: COLORS.finding}, hovertemplate: "%{text}<br>click: open<extra></extra>"});
    const ticks = items.length <= 60;
    const layout = {margin: {l: 70, r: 20, t: 60, b: ticks ? 140 : 40}, hovermode: "closest",
                    xaxis: {anchor: "y2", tickmode: ticks ? "array" : "auto", tickvals: ticks ? x : undefined,
                            ticktext: ticks ? items.map(it => it.label.length > 28 ? "…" + it.label.slice(-27) : it.label) : undefined,
                            tickangle: -45, title: ticks ? undefined : {text: "position in execution order"}},
                    yaxis: {type: "log", domain: [0.4, 1], title: {text: "relative RMS error"}, exponentformat: "power"},
                    yaxis2: {type: "log", domain: [0, 0.33], title: {text: "share of output error"}, exponentformat: "power"},
                    legend: {orientation: "h", x: 0, y: 1.01, yanchor: "bottom"}};
    const self = this;
    Plotly.react(this.el, traces, layout, config).then(() => {
      if (self.bound) return;
      self.bound = true;
      self.el.on("plotly_click", ev => {
        const point = ev.points[0];
        if (point.data.name === "findings") { location.hash = point.customdata; return; }
        const item = self.shown[point.x];
        if (item && item.group) { self.expanded.add(item.id); self.opened.push(item.id); self.draw(); }
      });
    });
    const groups = items.filter(it => it.group).length;
    this.status.textContent = items.length + " shown (" + groups + " modules aggregated) of " + this.data.nodes.names.length + " nodes";
  };
  AlongChart.prototype.focus = function (anchor) {
    for (const [i, refs] of Object.entries(this.findingAt)) {
      if (!refs.some(r => r.id === anchor)) continue;
      prefixes(this.data.nodes.modules[+i]).forEach(p => this.expanded.add(p));
      const mode = refs.find(r => r.id === anchor).modes.find(m => this.data.precisions.includes(m));
      if (mode) this.mode = mode;
      this.el.parentNode.querySelector("select").value = this.mode;
      this.draw();
      this.el.scrollIntoView({behavior: "smooth"});
      return;
    }
  };

  function topChart(data) {
    const el = byId(data.anchor + "-top");
    if (!el) return;
    const mode = data.precisions[0];
    const traces = [];
    data.precisions.forEach((m, k) => {
      const rows = data.top[m].slice().reverse();
      const visible = k === 0;
      traces.push({type: "bar", orientation: "h", name: "predicted", y: rows.map(r => r.label), x: rows.map(r => r.predicted),
                   visible: visible, marker: {color: COLORS.local}, hovertemplate: "%{y}: %{x:.1%}<extra>predicted</extra>"});
      if (data.nodes.measured) {
        traces.push({type: "bar", orientation: "h", name: "measured", y: rows.map(r => r.label), x: rows.map(r => r.measured),
                     visible: visible, marker: {color: COLORS.received}, hovertemplate: "%{y}: %{x:.1%}<extra>measured</extra>"});
      }
    });
    const per = data.nodes.measured ? 2 : 1;
    const buttons = data.precisions.map((m, k) => ({label: m, method: "update",
      args: [{visible: traces.map((_, t) => Math.floor(t / per) === k)}]}));
    const layout = {barmode: "group", margin: {l: 230, r: 20, t: 36, b: 40}, xaxis: {tickformat: ".0%", title: {text: "share of the output error"}},
                    updatemenus: [{type: "buttons", direction: "right", x: 0, y: 1.18, xanchor: "left", buttons: buttons}],
                    legend: {orientation: "h", y: -0.25}};
    Plotly.newPlot(el, traces, layout, config);
    el.on("plotly_click", ev => {
      const label = ev.points[0].y, m = data.precisions[Math.floor(ev.points[0].curveNumber / per)];
      const row = data.top[m].find(r => r.label === label);
      const refs = row && data.findings[row.i];
      if (refs && refs.length) location.hash = refs[0].id;
    });
  }

  function planChart(data) {
    const el = byId(data.anchor + "-plan");
    if (!el || !data.plan) return;
    const c = data.plan;
    const traces = Object.entries(c.series).map(([name, ys]) => ({type: "scatter", mode: "lines+markers", name: name, x: c.x, y: ys}));
    Plotly.newPlot(el, traces, {margin: {l: 70, r: 20, t: 10, b: 80}, yaxis: {type: c.log ? "log" : "linear", title: {text: c.y_title || ""}}}, config);
  }

  let charts = 0;
  root.querySelectorAll("script.report-data").forEach(script => {
    const data = JSON.parse(script.textContent);
    outputsChart(data);
    planChart(data);
    if (data.nodes.names.length) {
      const along = new AlongChart(data);
      topChart(data);
      byId(data.anchor).querySelectorAll("a.show-node").forEach(a => {
        a.addEventListener("click", ev => { ev.preventDefault(); along.focus(a.dataset.anchor); });
      });
    }
    charts += byId(data.anchor).querySelectorAll(".js-plotly-plot").length;
  });
  root.dataset.charts = String(charts);
})"""
