"""Where the probe's measured output error and the check's predicted one differ by more than a factor
of 3: one note per mode, with both figures and the likeliest reason the probe's ledger shows.

A note, not a finding: it says how far preclint's own prediction was off for this model, which is no
fault of the model (the model's error itself is the measured figure, and a layer that holds much of it
unflagged is PCL900's). It tells a user which of the two figures to trust and why they disagree.

Both figures are raised to float32's own rounding (FLOAT32_NOISE) before they are compared, so two
errors that are both float32 noise agree; a measured error within the model's run-to-run noise
(noise.py) says nothing and gets no note.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from preclint.core.numerics import MODES
from preclint.core.findings import percent, sci
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind
from preclint.core.notes import Note
from preclint.predict.ordinary import FLOAT32_NOISE, ordinary_local

# The error model's predictions land within this factor of the measured errors (issue 26's target,
# and PCL900's EXCESS); beyond it the prediction misses something this model does.
FACTOR = 3.0
# Shape ops that join values (a KV cache grown by a step): their result is no part of their first input.
JOINS = frozenset({"cat", "concat", "stack"})
# A node is named as the reason where it holds at least this share of the measured error.
MIN_SHARE = 0.1


def _clamped(x: float) -> float:
    return max(x, FLOAT32_NOISE)


def mismatch_notes(report, ctx, result) -> List[Note]:
    """The notes, one per mode of ``result`` whose measured output error and ``report``'s predicted
    one (its summary) lie more than FACTOR apart; for a model of several outputs, one per output
    (each judged on its own: a large output predicted well never hides a small one predicted badly)."""
    notes: List[Note] = []
    for mode, measure in result.modes.items():
        entry = report.summary.get(mode) or {}
        predicted = (entry.get("predicted_output") or {}).get("rel_error")
        measured = (entry.get("measured_output") or {}).get("rel_error")  # None for a degenerate output
        if measure.error is not None or predicted is None or measured is None:
            continue
        if not (math.isfinite(predicted) and math.isfinite(measured)) or result.within_noise(measured):
            continue
        each = _output_notes(ctx, mode, entry, measure)
        if each is not None:
            notes += each
            continue
        over = _clamped(measured) / _clamped(predicted)
        if 1 / FACTOR <= over <= FACTOR:
            continue
        text = (f"probe: {mode} measured an output error of {sci(measured)} against {sci(predicted)} predicted "
                f"({_how(over)})")
        reason = _reason(ctx, measure, mode, predicted, measured, entry)
        notes.append(Note("mismatch", text + (f"; likeliest reason: {reason}" if reason else "")
                          + ". The measured figure is this model's on this device."))
    return notes


def _how(over: float) -> str:
    return f"{over:.1f}x the prediction" if over > 1 else f"{1 / over:.1f}x below the prediction"


def _output_notes(ctx, mode: str, entry: Dict, measure) -> Optional[List[Note]]:
    """A model of several outputs: one note per output whose own figures lie more than FACTOR apart,
    with why where the graph shows it (a slice of another value, the ops it is computed from); None
    where the outputs have no figures of their own (one output, or outputs the graph does not tell
    apart), for the outputs together to be judged instead."""
    predicted = entry.get("outputs") or []
    measured = (entry.get("measured_output") or {}).get("outputs") or []
    if len(predicted) < 2 or len(predicted) != len(measured):
        return None
    notes: List[Note] = []
    for figure, m in zip(predicted, measured):
        p_err, m_err = (figure or {}).get("rel_error"), (m or {}).get("rel_error")
        if p_err is None or m_err is None or not (math.isfinite(p_err) and math.isfinite(m_err)):
            continue
        over = _clamped(m_err) / _clamped(p_err)
        if 1 / FACTOR <= over <= FACTOR:
            continue
        text = f"probe: {mode} measured {figure.get('output')} with an error of {sci(m_err)} against {sci(p_err)} predicted ({_how(over)})"
        reason = _output_reason(ctx, mode, entry, measure, figure.get("output"), predicted, over=over)
        notes.append(Note("mismatch", text + (f"; likeliest reason: {reason}" if reason else "")
                          + ". The measured figure is this output's on this device."))
    return notes


def _output_reason(ctx, mode: str, entry: Dict, measure, output: Optional[str], figures: List[Dict], *,
                   over: float) -> Optional[str]:
    """Why one output's figures differ: it is a slice of a value whose error it is given; the float32
    kernels or the node the ledger blames among the ops it is computed from."""
    sliced = _sliced_from(ctx.graph, output, figures)
    if sliced is not None:
        part, whole, whole_output = sliced
        text = (f"it is a part of {whole_output or ctx.display(whole.name)}, and the prediction gives a part the "
                f"relative error of the whole it is taken from, while this part's elements carry "
                f"{'more' if over > 1 else 'less'} of it")
        if part.out.rms and whole.out.rms and not 1 / FACTOR <= whole.out.rms / part.out.rms <= FACTOR:
            text += f" (its RMS {sci(part.out.rms)}, the whole's {sci(whole.out.rms)})"
        return text
    producer = _producer(ctx.graph, output, figures)
    within = _upstream(ctx.graph, producer) | {producer} if producer is not None else None
    if measure.diverged_at is not None or measure.first_nonfinite is not None:
        return _reason(ctx, measure, mode, 0.0, 0.0, entry)
    if MODES[mode].kernel_choice_matters and over < 1:
        # the convs and matmuls this output is computed from; the model's figure with float32 kernels
        # is for the outputs together, not for this one
        return _float32_kernels(ctx, measure, 0.0, {}, within=within)
    if within is None:
        return None
    whole_predicted = (entry.get("predicted_output") or {}).get("rel_error")
    whole_measured = (entry.get("measured_output") or {}).get("rel_error")
    if over > 1:
        return _under_rated(ctx, measure, mode, whole_predicted, whole_measured, within=within)
    return _over_rated(ctx, measure, mode, whole_predicted, whole_measured, within=within)


def _output_producers(graph, figures: List[Dict]) -> Optional[Dict[str, str]]:
    """Each of ``figures``' outputs (as the user reads it: output['pooler_output']) and the node whose
    value the model returns as it; None where the graph's float outputs do not line up with them."""
    outputs = graph.output_nodes
    if len(outputs) != 1:
        return None
    producers = [n for n in outputs[0].inputs if graph.get(n) is not None and graph[n].out is not None
                 and graph[n].out.is_float]
    names = [f.get("output") for f in figures]
    if len(producers) != len(names):
        return None
    return dict(zip(names, producers))


def _producer(graph, output: Optional[str], figures: List[Dict]) -> Optional[str]:
    """The node whose value the model returns as ``output``."""
    return (_output_producers(graph, figures) or {}).get(output)


def _sliced_from(graph, output: Optional[str], figures: List[Dict]) -> Optional[tuple]:
    """(the output's producer, the node it is a slice or view of: getitem, select, reshape, and that
    node's output name where the model returns it too), where the output's producer is a slice."""

    producers = _output_producers(graph, figures)
    if producers is None or output not in producers:
        return None
    part = node = graph[producers[output]]
    if node.kind != Kind.SHAPE or not node.inputs or node.fn in JOINS:
        return None
    while node.kind == Kind.SHAPE and node.fn not in JOINS and node.inputs and graph.get(node.inputs[0]) is not None:
        node = graph[node.inputs[0]]
    if node.out is None:
        return None
    # the whole as the user reads it, where the model returns it too (DINOv2's last_hidden_state)
    return part, node, next((name for name, producer in producers.items() if producer == node.name), None)


def _reason(ctx, measure, mode: str, predicted: float, measured: float, entry: Dict) -> Optional[str]:
    if measure.diverged_at is not None:
        return (f"control flow left the reference's path at {ctx.display(measure.diverged_at)}, which the "
                "prediction does not model")
    if measure.first_nonfinite is not None:
        return f"values became inf/NaN at {ctx.display(measure.first_nonfinite)}"
    if MODES[mode].kernel_choice_matters and measured < predicted:
        reason = _float32_kernels(ctx, measure, measured, entry)
        if reason:
            return reason
    if measured > predicted:
        return _under_rated(ctx, measure, mode, predicted, measured)
    return _over_rated(ctx, measure, mode, predicted, measured)


def _float32_kernels(ctx, measure, measured: float, entry: Dict, within: Optional[set] = None) -> Optional[str]:
    """TF32 over-predicted: the device ran float32 kernels for convs and matmuls the prediction
    gave TF32 (the ledger's tf32_applied); only those ``within`` the given nodes where given."""
    dots = [(name, m) for name, m in measure.nodes.items() if m.tf32_applied is not None
            and (within is None or name in within)
            and ctx.graph.get(name) is not None and ctx.graph[name].kind in DOT_PRODUCT_KINDS]
    plain = [name for name, m in dots if not m.tf32_applied]
    if not plain:
        return None
    text = f"{len(plain)} of the {len(dots)} convs and matmuls ran float32 kernels on this device, not TF32"
    alternative = (entry.get("if_float32_kernels") or {}).get("rel_error")
    if alternative is not None:
        text += f" (the prediction with float32 kernels where the backend chooses: {sci(alternative)})"
    return text


def _contributors(measure) -> List[tuple]:
    return sorted(((m.contribution, name) for name, m in measure.nodes.items()
                   if m.contribution is not None and math.isfinite(m.contribution)), reverse=True)


def _under_rated(ctx, measure, mode: str, predicted: float, measured: float,
                 within: Optional[set] = None) -> Optional[str]:
    """Measured above predicted: the node holding most of the measured error that the prediction
    under-rates the most (its measured part of the error against its predicted part); only those
    ``within`` the given nodes (the ops one output is computed from) where given, their shares of
    all the outputs' error said so."""
    prediction = ctx.predictions.get(mode)
    shares = prediction.contributions if prediction is not None else {}
    candidates = []
    for share, name in _contributors(measure):
        if share < MIN_SHARE:
            break
        if within is not None and name not in within:
            continue
        measured_part = math.sqrt(share) * measured  # contributions are shares of the squared error
        predicted_part = math.sqrt(max(shares.get(name, 0.0), 0.0)) * predicted
        candidates.append((measured_part / max(predicted_part, FLOAT32_NOISE * 1e-3), share, name))
    if within is not None:  # one output's: a node whose own part is no FACTOR over its prediction explains nothing
        candidates = [c for c in candidates if c[0] > FACTOR]
        if not candidates:
            return None
    if not candidates:
        step = _amplifier(ctx, measure)
        if step:
            return step
        explained = measure.explained
        if explained is not None and explained < 0.5:
            return (f"no node holds {percent(MIN_SHARE)} of it, and one node's rounding at a time explains "
                    f"{percent(explained)} of it: the error comes from interactions (decisions, masks, "
                    "reorderings) the first-order ledger does not see")
        return None
    _, share, name = max(candidates)
    of = "the measured error" if within is None else "all the outputs' measured error"
    text = f"{ctx.display(name)} holds {percent(share)} of {of}, predicted {percent(shares.get(name, 0.0))}"
    node = ctx.graph.get(name)
    m = measure.nodes[name]
    ordinary = ordinary_local(node, mode, m.dtype) if node is not None else None
    if m.local is not None and m.local.rel_error is not None and ordinary:
        text += (f"; its own error {sci(m.local.rel_error)} is {m.local.rel_error / ordinary:.1f}x what ordinary "
                 f"rounding gives this op ({sci(ordinary)})")
    return text


def _amplifier(ctx, measure) -> Optional[str]:
    """The node whose measured output error grows most over what reaches it, where it grows FACTOR-fold
    at least: a step (floor, round, torch.where on a comparison) that rounding moves values across,
    which the prediction's linear gains do not see; with the comparisons that flipped before it."""
    gains = [(m.amplification, name) for name, m in measure.nodes.items()
             if m.amplification is not None and math.isfinite(m.amplification) and m.amplification >= FACTOR]
    if not gains:
        return None
    gain, name = max(gains)
    text = f"the error grows {gain:.1f}x at {ctx.display(name)}"
    flipped = [(n, m) for n, m in measure.nodes.items() if m.flips and m.units and n in _upstream(ctx.graph, name)]
    if flipped:
        n, m = flipped[0]
        text += f", after {m.flips} of {m.units} decisions at {ctx.display(n)} flipped"
    return text + ": rounding moves values across its steps, which the prediction's linear gains do not see"


def _upstream(graph, name: str) -> set:
    seen, todo = set(), [name]
    while todo:
        node = graph.get(todo.pop())
        for i in node.inputs if node is not None else ():
            if i not in seen:
                seen.add(i)
                todo.append(i)
    return seen


def _over_rated(ctx, measure, mode: str, predicted: float, measured: float,
                within: Optional[set] = None) -> Optional[str]:
    """Measured below predicted: the node the prediction charges most (of those ``within`` the
    given nodes, where given), against what it measured."""
    prediction = ctx.predictions.get(mode)
    charged = {name: share for name, share in (prediction.contributions if prediction is not None else {}).items()
               if within is None or name in within}
    if not charged:
        return None
    name, share = max(charged.items(), key=lambda item: item[1])
    m = measure.nodes.get(name)
    if m is None or m.contribution is None:
        return f"{ctx.display(name)}, predicted to hold {percent(share)} of the error, was not measured"
    of = "the error" if within is None else "all the outputs' error"
    text = f"{ctx.display(name)} is predicted to hold {percent(share)} of {of} and measured {percent(max(m.contribution, 0.0))}"
    node = ctx.graph.get(name)
    if m.local is not None and m.local.rel_error is not None and node is not None and node.out is not None:
        node_prediction = prediction.nodes.get(name)
        if node_prediction is not None and node.out.rms:
            text += (f" (its own error {sci(m.local.rel_error)} measured, "
                     f"{sci(node_prediction.local / node.out.rms)} predicted)")
    return text
