"""The error model: per precision mode, the error each node's roundings put on the output, the error
each decision receives and how often it flips, and the share of each node in the output error.

Per node, the format it computes in (predict/formats.py), its local rounding error
(predict/local.py) and whether it leaves the format's range (predict/range.py) come first.

The output error adds, over nodes, each rounding's relative RMS squared times its gain to the
output (Gains, of reference/analyses/gains.py: ``out`` for rounding a result, ``operands`` for rounding the
operands of a dot product), assuming independent rounding errors. One operand rounding has relative RMS
C_INPUT / sqrt(2) * u (two operands give C_INPUT * u); a stored result C_OUTPUT * u.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import AbstractSet, Dict, Iterable, List, Optional

from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.core.numerics import C_INPUT, C_OUTPUT, DTYPE_FORMATS, FORMATS, MODES, Mode, gaussian_max_factor
from preclint.predict.accumulation import terms_rms
from preclint.predict.formats import input_formats, node_format
from preclint.predict.local import local_error, result_rounding, rounding_terms
from preclint.predict.range import mark_poles, overflows, reaching_absmax
from preclint.predict.scaled import converted
from preclint.reference.analyses.attention import AttentionRoundings
from preclint.reference.analyses.contraction import Contraction
from preclint.reference.analyses.decision_gains import DecisionGains
from preclint.reference.analyses.margins import DecisionMargins, RoundingMargins, deciding_input
from preclint.reference.analyses.exact_rounding import ExactRounding
from preclint.reference.analyses.gains import Gains
from preclint.reference.analyses.reach import Reach
from preclint.reference.analyses.recurrence import Recurrence
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.reference.analyses.stored_parameters import StoredParameters
from preclint.reference.analyses.output_gains import OutputGains
from preclint.reference.analyses.received_gains import ReceivedGains
from preclint.reference.analyses.rounded_ties import RoundedTies, rounding_made_ties
from preclint.reference.analyses.sampled_inputs import SampledInputs
from preclint.reference.analyses.terms import Terms

# The records the error figures read (local, received and output errors, contributions, flips):
# computed wherever errors are predicted, whatever the rules selected read themselves.
PREDICTED_ERRORS_NEED = (Terms, Contraction, Gains, Reach, DecisionMargins, RoundingMargins, DecisionGains,
                         StoredParameters, Recurrence, AttentionRoundings, ExactRounding, RoundedTies,
                         OutputGains, SampledInputs)


def errors_need(modes: Iterable[str]) -> tuple:
    """The records the error figures of ``modes`` read: PREDICTED_ERRORS_NEED, and the scaled
    operands' statistics where a mode runs scaled GEMMs."""
    scaled = any(MODES[m].recipe is not None for m in modes if m in MODES)
    return PREDICTED_ERRORS_NEED + ((ScaledOperands,) if scaled else ())

# The most error an output can carry: a real error saturates where the output no longer resembles the
# reference, and an unrelated output of the same RMS differs from it by sqrt(2) of that RMS.
SATURATION = math.sqrt(2.0)


@dataclass
class NodePrediction:
    fmt: str  # format the node's result is stored in under the mode ("fp32", "fp16", "bf16", "int")
    local: float = 0.0  # RMS absolute error the node itself adds
    overflow: bool = False  # its result (or its rounded inputs) leave the format's finite range
    pole: bool = False  # it divides by (or takes rsqrt/log of) a value that becomes 0 in its format
    received: Optional[float] = None  # RMS error predicted at its input (decision nodes)
    flip_fraction: Optional[float] = None  # decision nodes: expected fraction of decisions that change
    # decision nodes: expected fraction that differ between two runs of the mode on devices whose
    # kernels round otherwise (float32 on two devices: sums in another order), from the roundings
    # that differ between them (kernel_dependent), each run's independent of the other's
    disagreement: Optional[float] = None
    # amplifiers (ReceivedGains): input node -> the relative RMS error it reaches the node with
    inputs_received: Dict[str, float] = field(default_factory=dict)
    # amplifiers (ReceivedGains.leaving): the relative RMS error of its result from every rounding
    # upstream, along every path (its own rounding apart)
    leaving: Optional[float] = None


@dataclass
class ModePrediction:
    mode: Mode
    nodes: Dict[str, NodePrediction] = field(default_factory=dict)
    output_rms: float = 0.0  # RMS of the reference output
    output_numel: int = 0
    output_error: Optional[float] = None  # RMS absolute error of the output
    finite: bool = True
    contributions: Dict[str, float] = field(default_factory=dict)  # node -> share of output error variance
    layers: Dict[str, str] = field(default_factory=dict)  # node -> the first node of the layer it is a call of
    # node that makes one of several outputs -> RMS absolute error of that output, from a pass of its own
    # (OutputGains)
    output_errors: Dict[str, float] = field(default_factory=dict)

    @property
    def rel_error(self) -> Optional[float]:
        if self.output_error is None or not self.finite:
            return None
        return self.output_error / self.output_rms if self.output_rms > 0 else 0.0

    @property
    def max_abs_error(self) -> Optional[float]:
        if self.output_error is None or not self.finite:
            return None
        return self.output_error * gaussian_max_factor(self.output_numel)

    def top_contributors(self, n: int = 5) -> List[tuple]:
        """The layers that hold most of the output error, as (first node, share): a module called
        several times (a shared block, a loop) is one layer, its calls' shares added up."""
        shares: Dict[str, float] = {}
        for name, share in self.contributions.items():
            layer = self.layers.get(name, name)
            shares[layer] = shares.get(layer, 0.0) + share
        ranked = sorted(shares.items(), key=lambda item: (-item[1], item[0]))
        return [(name, share) for name, share in ranked[:n] if share > 0]


def propagated_error(node: Node, terms: Dict[str, float], gains: Optional[tuple]) -> float:
    """Mean-square error this node's roundings put on a downstream value with the given gains."""
    if gains is not None:
        gain_out, gain_operands = gains
    elif node.record(Gains) is not None:
        gain_out, gain_operands = node.record(Gains).out, node.record(Gains).operands
    else:
        gain_out, gain_operands = 0.0, None
    total = 0.0
    if "operands" in terms:
        if gain_operands is not None:
            total += terms["operands"] ** 2 * gain_operands
        elif node.out is not None and node.out.rms > 0:
            # no operand gradients (a fused module such as MultiheadAttention): the rounding of both
            # operands as a relative error of the result
            rel = math.sqrt(2.0) * terms["operands"] * (terms_rms(node) or node.out.rms) / node.out.rms
            total += rel**2 * gain_out
    if "accumulation" in terms and node.out is not None and node.out.rms > 0:
        # accumulating in float16 errs by the size of the terms, independently per output
        rel = terms["accumulation"] * (terms_rms(node) or node.out.rms) / node.out.rms
        total += rel**2 * gain_out
    if "out_of_range_to_output" in terms and gains is None:
        total += terms["out_of_range_to_output"]  # a coherent change, carried to the output as it is
    elif "out_of_range" in terms:
        total += terms["out_of_range"] ** 2 * gain_out
    if "recurrence_to_output" in terms and gains is None:  # an RNN's steps' roundings, carried to the output
        total += terms["recurrence_to_output"]
    if "recurrence" in terms:  # the steps' roundings, as they reach this output of an RNN
        total += terms["recurrence"] ** 2 * gain_out
    elif "recurrence_toward" in terms and gains is not None:
        total += terms["recurrence_toward"] ** 2 * gain_out
    if "sampled" in terms:  # the error of positions it samples at, which its backward does not carry
        total += terms["sampled"] ** 2 * gain_out
    if "internal" in terms:  # a fused module's inner roundings, as they reach this output of it
        total += terms["internal"] ** 2 * gain_out
    if "result_to_output" in terms and gains is None:
        total += terms["result_to_output"]
    elif "result" in terms:
        total += terms["result"] ** 2 * gain_out
    return total


def expected_flip_fraction(margins: List[float], sigma: float, compare: bool, ties_flip: bool = False) -> float:
    """Expected fraction of decisions that change when each compared value carries N(0, sigma^2) error.

    An order between two values flips when their error difference (std sigma*sqrt(2)) exceeds the
    gap; a comparison with a constant when the value's own error exceeds its distance to it.

    A margin of exactly 0 is a tie in float32 (equal values: zeros after a ReLU, a padded or repeated
    input, equal scores): the values are computed alike and stay equal under any precision, so the
    tie-break decides it as before and it is not a flip (ties() counts them apart). ``ties_flip``:
    against float64 (the fp32 mode, or values whose ties float32's rounding made: rounded_ties.py) a
    tie in float32 is one float32's own rounding made, which float64 orders: a coin flip, whatever
    error the precision adds.
    """
    if not margins:
        return 0.0
    if sigma <= 0:
        return 0.5 * ties(margins) if ties_flip else 0.0
    spread = sigma * (1.0 if compare else math.sqrt(2.0))
    total = sum(0.5 * math.erfc(m / (spread * math.sqrt(2.0))) for m in margins if m > 0 or ties_flip)
    return total / len(margins)


# Ops whose float32 result is the same on every device, given the same operands: IEEE 754 rounds
# them correctly (or they select a value). Two devices' runs differ only where the others round
# (sums in another order, exp/log/tanh of another library) and in what those pass on.
CORRECTLY_ROUNDED = frozenset(
    """add sub rsub mul div true_divide neg abs sqrt relu relu6 hardtanh clamp clamp_min clamp_max clip
    maximum minimum where masked_fill max_pool max min amax amin floor ceil round trunc sign fmod
    remainder square getitem identity dropout""".split())


def kernel_dependent(node: Node) -> bool:
    """Whether another device's kernel may round the node's result otherwise (see CORRECTLY_ROUNDED)."""
    if node.kind in DOT_PRODUCT_KINDS or node.kind in (Kind.REDUCTION, Kind.SCAN, Kind.SOFTMAX, Kind.NORM,
                                                       Kind.BATCHNORM, Kind.RESAMPLE, Kind.POOL):
        return not node.fn.startswith("max_pool")
    return node.kind in (Kind.ELEMENTWISE, Kind.ACTIVATION) and node.fn not in CORRECTLY_ROUNDED


def expected_disagreement(margins: List[float], sigma: float, compare: bool) -> float:
    """Expected fraction of decisions that differ between two runs, each of whose compared values carries
    its own independent N(0, sigma^2) error: a decision that flips with probability q in each run
    differs between them with probability 2 q (1 - q). Unlike a flip within one device, an exact tie
    in float32 counts here (q = 1/2): values equal at float32's resolution need not stay equal when
    another device's kernels add in another order."""
    if sigma <= 0 or not margins:
        return 0.0
    spread = sigma * (1.0 if compare else math.sqrt(2.0))
    total = 0.0
    for m in margins:
        q = 0.5 * math.erfc(m / (spread * math.sqrt(2.0)))
        total += 2.0 * q * (1.0 - q)
    return total / len(margins)


def ties(margins: List[float]) -> float:
    """The fraction of decisions that are exact ties in float32 (margin 0)."""
    return sum(1 for m in margins if m == 0) / len(margins) if margins else 0.0


def predict_mode(graph: Graph, mode: Mode, float32: AbstractSet[str] = frozenset(),
                 cast_back: AbstractSet[str] = frozenset(), cast_inputs: bool = False) -> ModePrediction:
    """``float32``: nodes a mixed-precision plan computes in float32 (autocast off, float32 operands);
    ``cast_back``: those of them whose result the plan stores back in the low format; ``cast_inputs``: a
    cast model's float inputs count the rounding of their cast (the plan counts it through ``cast_back``)."""
    prediction = ModePrediction(mode)
    formats: Dict[str, str] = {}
    roundings: Dict[str, Dict[str, float]] = {}
    for node in graph.nodes:
        inputs = [graph[n] for n in node.inputs if graph.get(n) is not None]
        fmt = node_format(node, mode, input_formats(graph, node, mode, formats), formats.get(node.attrs.get("dtype_of", "")))
        if node.name in float32 and fmt in FORMATS:
            fmt = "fp32"
        formats[node.name] = fmt
        roundings[node.name] = rounding_terms(node, mode, fmt)
        prediction.nodes[node.name] = NodePrediction(
            fmt, local_error(node, mode, fmt), overflows(node, fmt, mode, inputs) if graph.ran_reference else False
        )
        _out_of_range_parameters(node, mode, fmt, roundings[node.name], prediction.nodes[node.name])
        # (a scaled GEMM with an infinite scale computes NaN: PCL106)
        prediction.nodes[node.name].overflow |= math.isinf(prediction.nodes[node.name].local)
        if float32 and node.name not in float32 and node.params and not mode.autocast and fmt == getattr(mode.low, "name", ""):
            # a layer of a cast model casts a kept (float32) input down to its own dtype
            prediction.nodes[node.name].overflow |= graph.ran_reference and any(
                formats.get(i.name) == "fp32" and reaching_absmax(i) > mode.low.max_finite for i in inputs)
        if node.name in cast_back and fmt == "fp32" and mode.low is not None and node.out is not None:
            formats[node.name] = mode.low.name
            roundings[node.name]["result"] = result_rounding(node, mode.low.name, mode.low)
            prediction.nodes[node.name].local = roundings[node.name]["result"] * node.out.rms
            prediction.nodes[node.name].overflow |= graph.ran_reference and reaching_absmax(node) > mode.low.max_finite
        if cast_inputs and _rounded_on_entry(graph, node, mode, fmt):
            roundings[node.name]["result"] = result_rounding(node, fmt, mode.low)
            prediction.nodes[node.name].local = roundings[node.name]["result"] * node.out.rms
    if not graph.ran_reference:
        prediction.output_error = None
        return prediction
    owners = _inner_roundings(graph, mode, formats, roundings, prediction)
    mark_poles(graph, prediction, roundings)
    _sampled_positions(graph, prediction, roundings)

    # the output's own values where the run recorded them (every tensor of a nested output), else
    # the first value of each node it returns
    outputs = [s for node in graph.output_nodes
               for s in (node.outputs or [t for n in node.inputs for t in graph[n].outputs[:1]]) if s.is_float]
    numel = sum(s.numel for s in outputs)
    prediction.output_numel = numel
    if not all(s.finite for s in outputs):  # inf/NaN already in fp32 (PCL002): no error to predict from it
        prediction.finite = False
        return prediction
    if not numel:  # integer outputs only (labels, indices): their error is the decisions' flips
        prediction.finite = not any(p.overflow or p.pole for p in prediction.nodes.values())
        _predict_decisions(graph, prediction, roundings)
        return prediction
    prediction.output_rms = math.sqrt(sum(s.rms**2 * s.numel for s in outputs) / numel) if numel else 0.0
    prediction.finite = not any(p.overflow or p.pole for p in prediction.nodes.values())

    have_gains = any(n.record(Gains) is not None for n in graph.nodes)
    variance = changed = 0.0
    terms: Dict[str, float] = {}
    for node in graph.nodes:
        if not roundings[node.name]:
            continue
        if have_gains:
            term = propagated_error(node, roundings[node.name], None)
        else:
            # No gradients (an op without a derivative): assume each node's relative error reaches the
            # output unamplified, and take the largest, since errors barely compound through norms.
            rel = prediction.nodes[node.name].local / node.out.rms if node.out and node.out.rms > 0 else 0.0
            term = (rel * prediction.output_rms) ** 2
        if term <= 0:
            continue
        if have_gains and "out_of_range" in roundings[node.name]:
            changed += propagated_error(node, {k: v for k, v in roundings[node.name].items() if k.startswith("out_of_range")}, None)
        owner = owners.get(node.name, node.name)  # (an RNN's steps' error counts as the RNN's)
        terms[owner] = terms.get(owner, 0.0) + term
        variance = variance + term if have_gains else max(variance, term)
    # The model is linear in the errors, the real error is not: it saturates (SATURATION). A change of
    # the function itself (parameters out of the format's range) is not bound by the output's RMS: a
    # bounded output of small RMS (sigmoid probabilities near 0) that becomes 0.5 errs by more.
    prediction.output_error = min(math.sqrt(variance), max(SATURATION * prediction.output_rms, math.sqrt(changed)))
    if variance > 0 and have_gains:
        prediction.contributions = {name: term / variance for name, term in terms.items()}
        prediction.layers = module_calls(graph)

    _predict_decisions(graph, prediction, roundings)
    _predict_received(graph, prediction, roundings)
    _predict_outputs(graph, prediction, roundings)
    return prediction


def _rounded_on_entry(graph: Graph, node: Node, mode: Mode, fmt: str) -> bool:
    """Whether a cast model's float input counts the rounding of its cast: where, through ops that only
    move values, it reaches an output or an op other than a dot product (a conv, matmul or RNN that
    reads it counts that rounding as its operand's), as a KV cache the model concatenates its new row
    to and returns."""
    if node.kind != Kind.INPUT or mode.autocast or mode.low is None or fmt != mode.low.name:
        return False
    if node.out is None or not node.out.is_float or not node.out.finite:
        return False
    frontier, seen = [node.name], set()
    while frontier:
        name = frontier.pop()
        for user in graph.users(name):
            if user.kind == Kind.SHAPE and user.name not in seen:
                seen.add(user.name)
                frontier.append(user.name)
            elif user.kind not in DOT_PRODUCT_KINDS and user.kind != Kind.SHAPE:
                return True  # (an output node, or arithmetic)
    return False


def stored_out_of_range(node: Node, mode: Mode, fmt: str):
    """What storing the node's parameters in ``fmt`` changes beyond rounding (StoredParameters), where
    ``mode`` stores them there: a cast model all of them; autocast a conv's or matmul's operands, which
    it casts (its batch norms and other modules keep float32 buffers); else None."""
    record = node.record(StoredParameters)
    if record is None or mode.low is None or fmt != mode.low.name or fmt not in record.formats:
        return None
    if mode.autocast and node.kind not in DOT_PRODUCT_KINDS:
        return None
    if mode.recipe is not None and node.kind in DOT_PRODUCT_KINDS and converted(node, mode):
        return None  # a scaled GEMM scales its weight into the element format's range instead
    return record.formats[fmt]


def _out_of_range_parameters(node: Node, mode: Mode, fmt: str, terms: Dict[str, float], p: NodePrediction) -> None:
    """A finding's consequence in the numbers: parameters beyond the format's range (inf) or flushed to
    0 change the node's output by the relative error the reference pass measured (StoredParameters),
    an error of the result that the gains carry to the output like its rounding's; an output that
    becomes inf or NaN makes the mode's output non-finite."""
    consequence = stored_out_of_range(node, mode, fmt)
    if consequence is None:
        return
    if consequence.nonfinite > 0 or not math.isfinite(consequence.rel_error):
        p.overflow = True
        return
    if consequence.rel_error <= 0 or node.out is None:
        return
    terms["out_of_range"] = consequence.rel_error
    if consequence.output_ms is not None:
        terms["out_of_range_to_output"] = consequence.output_ms
    p.local = math.hypot(p.local, consequence.rel_error * node.out.rms)


def _inner_roundings(graph: Graph, mode: Mode, formats: Dict[str, str], roundings: Dict[str, Dict[str, float]],
                     prediction: ModePrediction) -> Dict[str, str]:
    """What a fused module rounds inside (an RNN's steps: Recurrence; attention's products:
    AttentionRoundings), put on the values the model takes from its outputs (its getitem nodes, whose
    gains carry it on), in place of the module's boundary roundings; returns each such value's module."""
    owners: Dict[str, str] = {}
    for node in graph.nodes:
        record = node.record(Recurrence) or node.record(AttentionRoundings)
        rounded = roundings.get(node.name, {})
        fmt = FORMATS.get(formats[node.name])
        if record is None or fmt is None or ("operands" not in rounded and "result" not in rounded):
            continue
        # (the node's own storage format: cuDNN's RNNs store float16 states under bfloat16 autocast too)
        stored = fmt if mode.low is not None and fmt.name != "fp32" and fmt.name in DTYPE_FORMATS.values() else None
        operand_u = C_INPUT / math.sqrt(2.0) * (stored or (mode.dot_format if "operands" in rounded else fmt)).unit_roundoff
        # an RNN's states, attention's scores: stored in the format where the mode stores results there
        # (TF32 keeps both in float32)
        stored_u = C_OUTPUT * stored.unit_roundoff if stored is not None else 0.0
        key = "internal"
        if isinstance(record, Recurrence):
            if record.to_output is not None:  # the model's own gradients carried through the steps
                rounded["recurrence_to_output"] = record.combined(record.to_output, operand_u, stored_u)
            # (where the model's own gradients carry the steps' error to the output, the taker's share
            # counts only toward other roots: a decision's input, one output of several)
            key = "recurrence" if record.to_output is None else "recurrence_toward"
        for taker in _takers(graph, node):
            index = next((i for i, s in enumerate(node.outputs) if s is not None and s.shape == taker.out.shape
                          and s.rms == taker.out.rms), None)
            if index is None:
                continue
            rel = record.relative(index, taker.out.rms, operand_u, stored_u)
            roundings[taker.name][key] = rel
            prediction.nodes[taker.name].local = math.hypot(prediction.nodes[taker.name].local, rel * taker.out.rms)
            owners[taker.name] = node.name
        rounded.pop("operands", None)  # (the inner operands and states include the boundary's)
        rounded.pop("result", None)
    return owners


def _sampled_positions(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    """The error of the positions an op samples at (RoIAlign's boxes: SampledInputs), as an error of
    its result, where no gradient carries it: the error the positions arrive with, op by op, times
    the factor the op multiplies it by."""
    nodes = [n for n in graph.nodes if n.record(SampledInputs) is not None and n.out is not None and n.out.rms > 0]
    rel = relative_errors(graph, prediction, integers_exact=True) if nodes else {}
    for node in nodes:
        gains = node.record(Gains)
        carried = gains.by_input if gains is not None else {}
        square = sum((factor * rel.get(name, 0.0)) ** 2 for name, factor in node.record(SampledInputs).factors.items()
                     if not carried.get(name))
        if square > 0 and node.name in roundings:
            roundings[node.name]["sampled"] = math.sqrt(square)
            local = prediction.nodes[node.name].local
            prediction.nodes[node.name].local = math.hypot(local, math.sqrt(square) * node.out.rms)


def _takers(graph: Graph, node: Node) -> List[Node]:
    """The nodes that take one tensor of ``node``'s tuple output (``out[1][0]``: two getitems deep)."""
    found, frontier = [], [node.name]
    for _ in range(2):
        nxt = []
        for n in graph.nodes:
            if n.fn == "getitem" and n.inputs and n.inputs[0] in frontier:
                if len(n.outputs) == 1 and n.out is not None and n.out.is_float:
                    found.append(n)
                else:
                    nxt.append(n.name)
        frontier = nxt
    return found


def _predict_received(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    """The relative error each input of an amplifier reaches it with, from the gains toward that input."""
    for node in graph.nodes:
        toward = node.record(ReceivedGains)
        if toward is None:
            continue
        for name, gains in toward.upstream.items():
            value = graph[name].out
            if value is None or value.rms <= 0:
                continue
            error = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gains.items() if n in roundings))
            prediction.nodes[node.name].inputs_received[name] = error / value.rms
        if toward.leaving and node.out is not None and node.out.rms > 0:
            error = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in toward.leaving.items()
                                  if n in roundings and n != node.name))
            prediction.nodes[node.name].leaving = error / node.out.rms


def _predict_outputs(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    """Each output's own error, from the gains toward it (OutputGains), bound as the whole output's is."""
    for node in graph.nodes:
        toward = node.record(OutputGains)
        if toward is None or node.out is None:
            continue
        variance = changed = 0.0
        for name, gains in toward.upstream.items():
            if name not in roundings:
                continue
            variance += propagated_error(graph[name], roundings[name], gains)
            beyond = {k: v for k, v in roundings[name].items() if k == "out_of_range"}
            changed += propagated_error(graph[name], beyond, gains) if beyond else 0.0
        prediction.output_errors[node.name] = min(math.sqrt(variance), max(SATURATION * node.out.rms, math.sqrt(changed)))


def module_calls(graph: Graph) -> Dict[str, str]:
    """Each node that calls a module -> the first node that calls the same module."""
    first: Dict[str, str] = {}
    calls: Dict[str, str] = {}
    for node in graph.nodes:
        if node.module_path and node.target.startswith("nn."):
            calls[node.name] = first.setdefault(node.module_path, node.name)
    return calls


def amplification(node: Node) -> Optional[float]:
    """How many times the op multiplies a relative error that arrives at its inputs, as seen from the
    output: sqrt(gain of its inputs through it / gain of its result). 1 for ops that pass relative
    error through (a product, a division, a random conv); large for a subtraction of nearly equal
    values or exp/softmax of large arguments. None where the reference pass has no gradients."""
    gains = node.record(Gains)
    return gains.amplification if gains is not None else None


def passed_on(node: Node, rel: Dict[str, float]) -> float:
    """The relative error the node's value carries from the relative errors ``rel`` of its inputs.

    Where the gradients tell each input's gain (``Gains.by_input``), each input's error is weighed by
    its own: sqrt(sum_i rel_i^2 by_input_i / out); a gate or a bias table that the op amplifies does
    not amplify the error of the activation beside it, and a dot product passes its activations' error
    on as its weights weigh it (a trained box head that cancels its terms amplified it 1.7x, a landmark
    head beside it damped it to 0.27x: 1 for both misapportioned MTCNN O-Net's outputs 5x). Inputs
    without a gain of their own, and ops without gains, pass on the largest incoming error times the
    op's amplification (1 for a dot product, whose operands' error is relative to its terms). The
    largest rather than a sum, since the branches of a DAG share their history."""
    gains = node.record(Gains)
    if gains is not None and gains.by_input and gains.out and gains.out > 0:
        weighed = sum(rel.get(n, 0.0) ** 2 * gain / gains.out for n, gain in gains.by_input.items())
        # (an input without a gradient of its own, one the model computes under no_grad, has no gain of its own)
        rest = max((rel.get(n, 0.0) for n in node.inputs if n not in gains.by_input), default=0.0)
        rest *= amplification(node) or 1.0
        return max(math.sqrt(weighed), rest) if math.isfinite(weighed) else rest
    incoming = max((rel.get(n, 0.0) for n in node.inputs), default=0.0)
    if node.kind not in DOT_PRODUCT_KINDS:
        incoming *= amplification(node) or 1.0
    return incoming


# Ops that pick elements of their first operand at positions the others give.
INDEXING_FNS = frozenset({"getitem", "index_select", "gather", "take", "masked_select"})


def relative_errors(graph: Graph, prediction: ModePrediction, integers_exact: bool = False) -> Dict[str, float]:
    """Relative RMS error of every value: what arrives from its inputs as the op passes it on
    (``passed_on``), combined with its own rounding. The fallback for values no output gradient
    reaches (detached scores, integer paths) and the error a node receives.

    ``integers_exact``: an integer result (NMS's kept indices, a top-k's, labels) carries no relative
    error of its own; what changes there are decisions, which flip_fraction predicts. Without it, the
    indices pass on the largest error among what they were decided from, and a detector's boxes and
    scores, both gathered by NMS's indices, each got the larger of the two. An indexing op passes on
    its values' error, not its indices' (a top-k's node stands for its values and indices alike)."""
    rel: Dict[str, float] = {}
    for node in graph.nodes:
        if integers_exact and node.out is not None and not node.out.is_float:
            rel[node.name] = 0.0
            continue
        if integers_exact and node.fn in INDEXING_FNS and node.inputs:
            incoming = rel.get(node.inputs[0], 0.0)  # the values indexed, not the indices (a top-k's, NMS's)
        else:
            incoming = passed_on(node, rel)
        local = prediction.nodes[node.name].local
        own = local / node.out.rms if node.out is not None and node.out.rms > 0 else 0.0
        rel[node.name] = math.hypot(incoming, own)
    return rel



def _predict_decisions(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    fallback: Optional[Dict[str, float]] = None
    collapsed: Dict[str, Optional[Node]] = {}
    for node in graph.nodes:
        decision = node.record(DecisionMargins)
        margins = decision or node.record(RoundingMargins)
        if margins is None:
            continue
        # float32 ties are coin flips against float64 under the fp32 mode, and under every mode where
        # float32's own rounding made them (a saturated softmax's scores): rounded_ties.py
        ties_flip = prediction.mode.floor or (
            decision is not None and rounding_made_ties(graph, node, deciding_input(node), collapsed) is not None)
        toward = node.record(DecisionGains)
        gains = toward.upstream if toward is not None else None
        if gains:
            received = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gains.items() if n in roundings))
        elif node.inputs and len(node.input_stats) > deciding_input(node) and node.input_stats[deciding_input(node)] is not None:
            fallback = fallback if fallback is not None else relative_errors(graph, prediction)
            deciding = deciding_input(node)
            received = fallback.get(node.inputs[deciding], 0.0) * node.input_stats[deciding].rms
        else:
            continue
        p = prediction.nodes[node.name]
        p.received = received
        # between two devices only the roundings their kernels do otherwise differ (kernel_dependent)
        between = received
        if gains:
            between = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gains.items()
                                    if n in roundings and kernel_dependent(graph[n])))
        gap = toward.gap if toward is not None else None
        if gap:
            # the error of the margins themselves (winner minus runner-up), from a pass along that direction
            spread = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gap.items() if n in roundings))
            apart = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gap.items()
                                  if n in roundings and kernel_dependent(graph[n])))
            p.flip_fraction = expected_flip_fraction(margins.values, spread, True, ties_flip)
            p.disagreement = expected_disagreement(margins.values, apart, True)
            continue
        # a comparison or a rounding moves one value against a fixed boundary; an order, two values
        compare = decision is None or node.kind == Kind.COMPARE
        p.flip_fraction = expected_flip_fraction(margins.values, received, compare, ties_flip)
        p.disagreement = expected_disagreement(margins.values, between, compare)


def predict(graph: Graph, modes: Iterable[str]) -> Dict[str, ModePrediction]:
    """Each mode's prediction as the model runs in it, a cast model's inputs cast with it (an input the
    model returns as it came, a KV cache passed through, carries that rounding alone)."""
    return {name: predict_mode(graph, MODES[name], cast_inputs=True) for name in modes}


def relative(value: Optional[float], scale: Optional[float]) -> Optional[float]:
    if value is None or scale is None:
        return None
    return value / scale if scale > 0 else 0.0
