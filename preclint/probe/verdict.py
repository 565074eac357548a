"""Confirm or refute every finding with what the probe measured, and report what no rule flagged.

A finding predicts one of a few things, which its rule declares (``Rule.measured_as``, one of
``rules.base.MEASURED_AS``); the probe compares it with the matching measurement:

| measured_as | predicted | measured | confirmed when |
|---|---|---|---|
| output | the output fails rtol/atol | the output of each mode's full run | some element fails |atol + rtol |ref|| |
| reference | a non-finite fp32 value | the node in float64 and in each mode | it is inf/NaN there too |
| overflow | a float16 overflow | the node in the mode's run | it is inf/NaN there (the reference is finite) |
| local | the node's own (local) error | its local error | measured >= predicted / 3 |
| flips | decisions flip | the decisions of the mode's run (else its detections) | at least one flipped (refuted: none, where none had under 5% probability) |
| received | the error the node's value carries | its received error | measured >= predicted / 3 |

A third, because the error model's predicted output errors lie within a factor of 3 of the measured
ones (115 of 118 zoo and example (model, mode) pairs on an H200: docs/error-model.md,
benchmarks/CLAIMS.md): below a third, the prediction was wrong in kind, not in degree. A model that
does not give the same output twice (probe/noise.py) has a measured error that is partly its own
noise: a size within 3x of that noise confirms nothing. Each measured mode gets a status; the finding is ``confirmed`` when at least
one mode it names is, ``refuted`` when every measured one is, and keeps no status when none of its
modes could be measured.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Set

from preclint.core.findings import ErrorFigure, Finding, percent, sci
from preclint.core.notes import Note
from preclint.reference.analyses.margins import DecisionMargins
from preclint.probe.ledger import ModeMeasure, ProbeResult
from preclint.rules import all_rules
from preclint.rules.base import Rule

CONFIRM_FRACTION = 1.0 / 3.0
# Measurements a model's run-to-run noise (probe/noise.py) can make on its own: an error's size and
# flipped decisions (judged by the error of what they read). A measured error within that noise
# confirms nothing; a refutation stands (noise only adds error), and so does an inf/NaN.
_NOISY_KINDS = frozenset({"output", "local", "received", "flips"})
# A run with no flipped decision refutes a predicted flip fraction only when no flip at all had less
# than this probability under it (decisions taken as independent).
NO_FLIPS_UNLIKELY = 0.05


def judge(findings: List[Finding], graph, result: ProbeResult, reference_nonfinite: Set[str],
          degenerate: bool = False) -> None:
    """Fill ``measured`` and ``status`` of each finding the probe can measure. ``degenerate``: the
    output is all zero or rounding residue (preclint.reference.degenerate), and its relative error is
    noise over noise: not reported."""

    rules = all_rules()
    for f in findings:
        rule = rules.get(f.code)
        kind = rule.measured_as if rule is not None and issubclass(rule, Rule) else Rule.measured_as
        if kind != "output" and not f.node:
            continue  # model-level or source findings: nothing at a node to measure
        modes = [m for m in (f.precisions or tuple(f.predicted)) if m in result.modes]
        statuses = []
        for mode in modes:
            measure = result.modes[mode]
            if measure.error is not None:
                continue
            figure = _measure(kind, f, graph, measure, reference_nonfinite)
            if figure is None:
                continue
            if figure.status == "confirmed" and kind in _NOISY_KINDS and result.within_noise(figure.rel_error):
                figure.status = None  # the model's own noise, not its precision, could have made it
            if kind == "output" and degenerate:
                figure.rel_error = None
            f.measured[mode] = figure
            if figure.status is not None:
                statuses.append(figure.status)
        if statuses:
            f.status = "confirmed" if "confirmed" in statuses else "refuted"
        if kind == "output":
            _tolerance_fix(f, result)


def _measure(kind: str, f: Finding, graph, measure: ModeMeasure, reference_nonfinite: Set[str]) -> Optional[ErrorFigure]:
    predicted = f.predicted.get(measure.mode)
    if kind == "output":
        if measure.output is None:
            return None
        figure = ErrorFigure(measure.output.rel_error, measure.output.max_abs_error)
        tolerance = measure.tolerance
        if tolerance is not None:
            figure.min_atol = tolerance.min_atol
            figure.min_rtol = tolerance.min_rtol
            figure.status = "confirmed" if tolerance.failing > 0 or not measure.output_finite else "refuted"
        else:
            figure.status = _by_size(predicted, figure.rel_error, not measure.output_finite)
        return figure
    m = measure.nodes.get(f.node)
    if m is None:
        return _detections_figure(measure) if kind == "flips" else None
    if kind == "flips":
        site = [n for n in graph.nodes if _same_site(graph[f.node], n)]
        flips = [measure.nodes[n.name] for n in site if n.name in measure.nodes and measure.nodes[n.name].flips is not None]
        if not flips:
            return _detections_figure(measure)
        units = sum(x.units or 0 for x in flips)
        changed = sum(x.flips or 0 for x in flips)
        # the error is that of what the decision reads (as the rule predicts it): an NMS's or argmax's
        # own result is indices, which carry no relative error
        node = graph[f.node]
        source = m if m.received is not None else measure.nodes.get(node.inputs[0]) if node.inputs else None
        received = source.received if source is not None else None
        figure = ErrorFigure(received.rel_error if received else None, received.max_abs_error if received else None,
                             flip_fraction=changed / units if units else 0.0)
        figure.status = "confirmed" if changed > 0 else _no_flips(predicted, units)
        return figure
    if kind == "overflow":
        figure = ErrorFigure(m.received.rel_error if m.received else None, m.received.max_abs_error if m.received else None)
        figure.status = "confirmed" if m.nonfinite else "refuted"
        return figure
    if kind == "reference":
        figure = ErrorFigure(m.received.rel_error if m.received else None, m.received.max_abs_error if m.received else None)
        figure.status = "confirmed" if f.node in reference_nonfinite or m.nonfinite else "refuted"
        return figure
    source = m.local if kind == "local" else m.received
    if source is None:
        return None
    figure = ErrorFigure(source.rel_error, source.max_abs_error)
    figure.status = _by_size(predicted, source.rel_error, m.nonfinite)
    return figure


def _no_flips(predicted: Optional[ErrorFigure], units: int) -> Optional[str]:
    """The verdict on a run where no decision flipped: refuted when that outcome is unlikely under
    the predicted flip fraction, no verdict when it is not (3% of 12 values expect 0.4 flips: a run
    with none is the likelier outcome, and says nothing against the rate)."""
    fraction = predicted.flip_fraction if predicted is not None else None
    if fraction is None or not units:
        return "refuted"
    return "refuted" if (1.0 - min(fraction, 1.0)) ** units < NO_FLIPS_UNLIKELY else None


def _detections_figure(measure: ModeMeasure) -> Optional[ErrorFigure]:
    """A decision the mode's run did not reach on the reference's path (an earlier flip sent it
    elsewhere), or could not compare unit by unit, is judged by what the decisions did to the
    detections the model returns, when it returns detections."""
    changes = measure.detections
    if changes is None or not changes.units:
        return None
    figure = ErrorFigure(measure.output.rel_error if measure.output else None,
                         measure.output.max_abs_error if measure.output else None, flip_fraction=changes.flip_fraction)
    figure.status = "confirmed" if changes.changed else "refuted"
    return figure


def _by_size(predicted: Optional[ErrorFigure], measured: Optional[float], nonfinite: bool) -> Optional[str]:
    if nonfinite:
        return "confirmed"
    if predicted is None or predicted.rel_error is None or measured is None or not math.isfinite(measured):
        return None
    return "confirmed" if measured >= CONFIRM_FRACTION * predicted.rel_error else "refuted"


def _same_site(a, b) -> bool:
    return a.name == b.name or (a.record(DecisionMargins) is not None and b.record(DecisionMargins) is not None
                                 and a.module_path == b.module_path
                                 and a.fn == b.fn and a.location == b.location)


def _tolerance_fix(f: Finding, result: ProbeResult) -> None:
    parts = []
    for mode, figure in sorted(f.measured.items()):
        tolerance = result.modes[mode].tolerance
        if tolerance is None or figure.min_atol is None:
            continue
        text = f"{mode} passes with atol >= {sci(figure.min_atol)} at rtol={sci(tolerance.rtol)}"
        if figure.min_rtol is not None:
            text += f", or rtol >= {sci(figure.min_rtol)} at atol={sci(tolerance.atol)}"
        else:
            text += f" (no rtol suffices at atol={sci(tolerance.atol)}: elements that are 0 in the reference miss it)"
        if tolerance.failing:
            text += f"; {percent(tolerance.failing / tolerance.numel)} of {tolerance.numel} elements fail now"
        parts.append(text)
    if parts:
        f.fix = f.fix.rstrip() + " Measured: " + "; ".join(parts) + "."


def summary_entries(result: ProbeResult, degenerate: bool = False) -> Dict[str, Dict]:
    """``measured_output`` for each mode of the report's summary; without its relative error when the
    output is ``degenerate`` (see judge)."""
    entries = {}
    for mode, measure in result.modes.items():
        if measure.error is not None:
            entries[mode] = {"error": measure.error}
            continue
        entry: Dict = {}
        if measure.output is not None:
            entry["rel_error"] = None if degenerate else measure.output.rel_error
            entry["max_abs_error"] = measure.output.max_abs_error
        if measure.outputs:
            entry["outputs"] = [None if f is None else {
                "rel_error": None if degenerate or not math.isfinite(f.rel_error) else f.rel_error,
                "max_abs_error": f.max_abs_error if math.isfinite(f.max_abs_error) else None,
                "finite": math.isfinite(f.rel_error)} for f in measure.outputs]
        entry["finite"] = measure.output_finite
        if measure.output_units:
            entry["flip_fraction"] = measure.output_flips / measure.output_units
        if measure.detections is not None:
            entry["detections"] = measure.detections.as_dict()
        if measure.explained is not None:
            entry["explained_by_contributions"] = round(measure.explained, 4)
        if measure.tolerance is not None:
            entry["min_atol"] = measure.tolerance.min_atol
            entry["min_rtol"] = measure.tolerance.min_rtol
        entries[mode] = entry
    return entries


def probe_notes(result: ProbeResult, display) -> List[Note]:
    """The probe's notes for the report: where it ran, then its own and each mode's, each with ``probe: ``."""
    env = result.environment
    if env.get("emulated"):
        where = f"emulated on {env.get('cpu') or env['device']} ({env.get('threads', '?')} threads)" \
            if env["device"] == "cpu" else f"emulated on {env['device']}"
    else:
        where = f"measured on {env.get('gpu', env['device'])} (CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')})"
    reference = env.get("reference", {}).get("dtype", "float64")
    notes = [Note("probe", f"probe: {where}, torch {env['torch']}, against a {reference} reference on the same device")]
    notes += [n.prefixed("probe: ") for n in result.notes]
    for mode, measure in result.modes.items():
        if measure.error is not None:
            notes.append(Note("probe", f"probe: {mode} could not be measured: {measure.error}"))
            continue
        if measure.detections is not None:
            notes.append(Note("probe", f"probe: {mode} detections against the {reference} reference: "
                                       f"{measure.detections.describe()}"))
        if measure.first_nonfinite is not None:
            notes.append(Note("probe", f"probe: under {mode} the values first become inf/NaN at "
                                       f"{display(measure.first_nonfinite)}"))
        if measure.diverged_at is not None:
            notes.append(Note("probe", f"probe: under {mode} control flow left the reference's path at "
                                       f"{display(measure.diverged_at)}; later nodes are not compared"))
        if measure.observer_delta is not None and measure.observer_delta != 0:
            notes.append(Note("noise", f"probe: under {mode} the observed run differs from the plain model by up to "
                                       f"{sci(measure.observer_delta)} (kernel nondeterminism)"))
        if measure.agreement is not None:
            a = measure.agreement
            text = (f"probe: {mode} contributions against one-node-at-a-time runs over {a['nodes']} nodes: "
                    f"correlation {sci(a['correlation'])}, largest difference {sci(a['max_abs_difference'])}")
            if "major_nodes" in a:
                text += f", {percent(a['major_within_2x'])} of the {a['major_nodes']} nodes above 5% within 2x"
            notes.append(Note("probe", text))
        notes += [n.prefixed(f"probe: {mode}: ") for n in measure.notes]
    return notes
