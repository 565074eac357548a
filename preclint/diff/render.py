"""`preclint diff`'s outputs: the console, JSON, SARIF (a result at the source line of each layer
that accounts for much of the difference, and of the node where the runs part) and an HTML page
with the two checks' ledgers side by side (report/html.py's page, with the diff's section on top).
Text from users' names and files goes through report/escape.py's boundary."""
from __future__ import annotations

import math
from typing import List, Optional

from preclint.core.findings import Finding, Location, percent, sci
from preclint.diff.ledgers import ModeDifference
from preclint.diff.walk import DiffResult
from preclint.diff.weights import stored_sentence
from preclint.locations.attach import display_location
from preclint.report import Report
from preclint.report.escape import json_text, visible_text
from preclint.report.html import PlanSection, render_many
from preclint.report.sarif import to_dict as sarif_document

SHOWN = 8  # layers listed per precision on the console
SARIF_SHARE = 0.1  # a layer that accounts for this fraction of a gap or more is a SARIF result
RULE_ID = "diff/explains-difference"
FRAGILE_ID = "diff/fragile"


def headline(result: DiffResult) -> List[str]:
    """The answer first: what makes a side unfit (weights no trained checkpoint holds, an output that
    is inf/NaN), one sentence per precision, then the run where the two runs part."""
    lines = [f"{line}." for line in result.fragile() if "weights are not valid" in line]
    lines += [f"{d.sentence}." for d in result.modes]
    parting = result.parting
    if parting is not None:
        first = parting.first
        a, b = parting.labels
        if first is None:
            lines.append(f"The runs of {a} and {b} do not part: every node agrees within the noise floor.")
        else:
            lines.append(f"The runs of {a} and {b} part at {_node(result, first.name)} (difference {sci(first.difference)}, "
                         f"noise threshold {sci(first.threshold)}).")
        replays = [r for r in parting.replays + ([parting.replay_all] if parting.replay_all else []) if r.explained is not None]
        if replays:
            best = max(replays, key=lambda r: r.explained)
            where = _node(result, best.node) if best is not parting.replay_all else best.node
            lines.append(f"Forcing {a}'s choices at {where} into {b} explains {percent(max(best.explained, 0.0))} of the "
                         f"output difference ({best.flips} of {best.units} choices changed).")
    return lines


def _node(result: DiffResult, name: str) -> str:
    module = result.module_of(name)
    return f"{module} ({name})" if module and module != name else name


def to_dict(result: DiffResult) -> dict:
    a, b = result.labels
    doc = {
        "labels": [a, b],
        "against": result.against,
        "measured": result.measured,
        "device": result.device,
        "summary": headline(result),
        "fragile": result.fragile(),
        "precisions": [d.as_dict() for d in result.modes],
        "checkpoints": {s.label: s.facts.as_dict() for s in result.sides} if result.against is None else
        {result.sides[0].label: result.sides[0].facts.as_dict()},
        "parting": result.parting.as_dict(result.module_of) if result.parting is not None else None,
        "notes": list(result.notes) + [n.text for s in result.sides for n in s.report.notes],
    }
    return doc


def render_json(result: DiffResult) -> str:
    return json_text(to_dict(result), indent=2, allow_nan=False) + "\n"


def render_console(result: DiffResult) -> str:
    a, b = result.labels
    how = "measured" if result.measured else "predicted"
    where = f", runs on {result.device}"
    models = " vs ".join(s.report.model or s.label for s in result.sides)
    out = [f"preclint diff: {a} vs {b} ({models}; ledgers {how}{where})", ""]
    out += headline(result)
    for diff in result.modes:
        out += ["", f"{diff.mode}:"] + _mode_table(diff)
    if result.against is None or len(result.sides) == 1:
        out += ["", "weights:"] + [f"  {stored_sentence(s.label, s.facts)}." for s in result.sides]
    if result.parting is not None:
        out += [""] + _parting_lines(result)
    notes = list(result.notes) + [n.text for s in result.sides for n in s.report.notes]
    if result.parting is not None:
        notes += result.parting.notes
    if notes:
        out += ["", "notes:"] + [f"  {n}" for n in dict.fromkeys(notes)]
    return "\n".join(visible_text(line) for line in out) + "\n"


def _mode_table(diff: ModeDifference) -> List[str]:
    if diff.error is not None:
        return [f"  not compared: {diff.error}"]
    a, b = diff.labels
    if any(diff.nonfinite):
        errors = (diff.error_a, diff.error_b)
        return [f"  {label}: output inf/NaN" + (f", first overflow at {at}" if at else "") if bad else
                f"  {label}: output error {sci(error)}" for label, bad, at, error in
                zip(diff.labels, diff.nonfinite, diff.overflow_at, errors)]
    rows = [("layer", "of diff", f"{a} local", f"{b} local", f"{a} recv", f"{b} recv", "own/inherited", "statistics")]
    for layer in diff.top(SHOWN):
        if layer.of_gap <= 0 and rows[1:]:
            break
        own = "n/a" if layer.own is None else f"{percent(layer.own)}/{percent(1 - layer.own)}"
        rows.append((f"{layer.module or layer.node} ({layer.node})", percent(max(layer.of_gap, 0.0)) if layer.of_gap >= 0
                     else f"-{percent(-layer.of_gap)}", sci(layer.a.local), sci(layer.b.local), sci(layer.a.received),
                     sci(layer.b.received), own, _stats_text(layer.stats)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + ("  " + r[-1] if r[-1] else "") for r in rows]
    if diff.groups:
        lines.append("  by module: " + ", ".join(f"{g} {percent(max(s, 0.0))}" for g, s in diff.groups[:4] if s > 0))
    return lines


_SHORT = {"folded_scale": "bn scale", "activation_absmax": "|act|max", "outlier_ratio": "outliers",
          "weight_absmax": "|w|max", "running_mean_absmax": "|mean|max", "min_margin": "margin"}


def _stats_text(stats) -> str:
    parts = []
    for key, (x, y) in stats.items():
        if x is None or y is None or (x == y and key not in ("folded_scale",)):
            continue
        if max(abs(x), abs(y)) > 0 and min(abs(x), abs(y)) > 0 and max(abs(x), abs(y)) / min(abs(x), abs(y)) < 1.2:
            continue
        parts.append(f"{_SHORT.get(key, key)} {sci(x)}/{sci(y)}")
    return ", ".join(parts[:3])


def _parting_lines(result: DiffResult) -> List[str]:
    parting = result.parting
    a, b = parting.labels
    out = [f"where the runs part ({a} recorded, {b} following it; relative RMS against {a}'s values):"]
    first = parting.first
    shown = [n for n in parting.nodes if n.parts]
    if first is not None:
        out.append(f"  first divergent: {_node(result, first.name)}: {sci(first.difference)} "
                   f"(noise threshold {sci(first.threshold)})")
    largest = sorted(shown, key=lambda n: -(n.contributed or 0.0))[:5]
    for n in largest:
        if not n.contributed:
            continue
        out.append(f"  {_node(result, n.name)}: difference {sci(n.difference)}, contributed {sci(n.contributed)}, "
                   f"inherited {sci(n.inherited)}")
    out.append(f"  output difference: {sci(parting.output_difference)}")
    for replay in parting.replays + ([parting.replay_all] if parting.replay_all else []):
        text = (f"  decision {_node(result, replay.node) if replay.node in {n.name for n in parting.nodes} else replay.node}: "
                f"{replay.flips} of {replay.units} choices changed")
        if replay.explained is not None:
            text += f"; {a}'s choices forced into {b} explain {percent(max(replay.explained, 0.0))} of the output difference"
        if replay.note:
            text += f" ({replay.note})"
        out.append(text)
    if not parting.replays:
        out.append("  decisions: none changed")
    return out


def findings(result: DiffResult) -> List[Finding]:
    """What makes a side fragile (invalid weights, an inf/NaN output), then the layers that explain the
    difference, as findings at their source lines (SARIF)."""
    found = [Finding(FRAGILE_ID, "fragile", "error", f"{line}.", "", None) for line in result.fragile()]
    for diff in result.modes:
        for layer in diff.layers:
            if layer.of_gap < SARIF_SHARE:
                break
            location = _location(layer.location)
            found.append(Finding(RULE_ID, "explains-difference", "warning",
                                 f"{layer.module or layer.node} accounts for {percent(layer.of_gap)} of the {diff.mode} "
                                 f"difference: {diff.sentence}.", _help(layer), location, (diff.mode.split()[0],),
                                 layer.module, layer.op, node=layer.node))
    parting = result.parting
    if parting is not None and parting.first is not None:
        node = result.sides[0].graph.get(parting.first.name)
        if node is not None and node.location is not None:
            a, b = parting.labels
            found.append(Finding("diff/runs-part", "runs-part", "info",
                                 f"The runs of {a} and {b} part here: difference {sci(parting.first.difference)} "
                                 f"(noise threshold {sci(parting.first.threshold)}).", "", display_location(node.location),
                                 (), node.module_path, node.target, node=node.name))
    return found


def _help(layer) -> str:
    if layer.own is None:
        return ""
    if layer.own >= 0.5:
        return f"it adds {percent(layer.own)} of the error at its output itself (local): its values, not its inputs"
    return f"{percent(1 - layer.own)} of the error at its output it received and passed on amplified"


def _location(data) -> Optional[Location]:
    if not data:
        return None
    return Location(data["path"], data.get("line", 1), data.get("column", 1), bool(data.get("library")))


def render_sarif(result: DiffResult) -> str:
    report = Report(findings=findings(result), model=" vs ".join(result.labels))
    document = sarif_document(report)
    driver = document["runs"][0]["tool"]["driver"]
    driver["rules"] = [_descriptor(RULE_ID, "explains-difference",
                                   "A layer that accounts for much of the difference between two models' errors."),
                       _descriptor("diff/runs-part", "runs-part", "The node where two runs first differ above their noise floor."),
                       _descriptor(FRAGILE_ID, "fragile", "A checkpoint whose weights are not valid (inf/NaN, a negative "
                                   "running variance), or whose output is inf/NaN under a precision.", "error")]
    index = {RULE_ID: 0, "diff/runs-part": 1, FRAGILE_ID: 2}
    for r in document["runs"][0]["results"]:
        r["ruleIndex"] = index[r["ruleId"]]
    return json_text(document, indent=2, allow_nan=False) + "\n"


def _descriptor(rule_id: str, name: str, text: str, level: str = "warning") -> dict:
    return {"id": rule_id, "name": name, "shortDescription": {"text": text}, "fullDescription": {"text": text},
            "help": {"text": "preclint diff: see docs/diff.md"}, "defaultConfiguration": {"level": level}}


def render_html(result: DiffResult) -> str:
    columns = ["precision", "layer", "of the difference"] + [f"{s} {k}" for s in result.labels for k in ("local", "received")] \
        + ["own / inherited"]
    rows = []
    for diff in result.modes:
        for layer in diff.top(SHOWN):
            if layer.of_gap <= 0:
                break
            rows.append([diff.mode, f"{layer.module or layer.node} ({layer.node})", percent(layer.of_gap),
                         _num(layer.a.local), _num(layer.b.local), _num(layer.a.received), _num(layer.b.received),
                         "n/a" if layer.own is None else f"{percent(layer.own)} / {percent(1 - layer.own)}"])
    chart = None
    parting = result.parting
    if parting is not None and parting.nodes:
        a, b = parting.labels
        chart = {"x": [_node(result, n.name) for n in parting.nodes], "log": True,
                 "y_title": f"{b} against {a} (relative RMS)",
                 "series": {"difference": [_positive(n.difference) for n in parting.nodes],
                            "contributed": [_positive(n.contributed) for n in parting.nodes],
                            "inherited": [_positive(n.inherited) for n in parting.nodes],
                            "noise threshold": [_positive(n.threshold) for n in parting.nodes]}}
    summary = " ".join(headline(result)) + " " + " ".join(f"{stored_sentence(s.label, s.facts)}." for s in result.sides)
    lead = PlanSection(summary, columns, rows, chart, heading="Diff")
    from dataclasses import replace

    reports = [replace(s.report, model=f"{s.label}: {s.report.model}") if len(result.sides) == 2 else s.report
               for s in result.sides]
    return render_many(reports, plan=lead, side_by_side=len(result.sides) == 2)


def _num(value):
    return float(value) if value is not None else None


def _positive(value):
    return value if value is not None and value > 0 and math.isfinite(value) else None


def render(result: DiffResult, fmt: str) -> str:
    if fmt == "json":
        return render_json(result)
    if fmt == "sarif":
        return render_sarif(result)
    if fmt == "html":
        return render_html(result)
    return render_console(result)
