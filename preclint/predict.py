"""The error model: per node and precision mode, the dtype it computes in, its local rounding error,
whether it leaves the format's range, and the error that reaches the output.

Local error (RMS, absolute) of a node, from NUMERICS.md:

* dot products (conv, linear, matmul) with inputs rounded to u_in and fp32 accumulation:
  C_INPUT * u_in * RMS(sqrt(sum_k (a_k b_k)^2)), plus C_OUTPUT * u_out * RMS(y) when the result is
  stored in a reduced format; independent of the reduction length K;
* any other op whose result is stored in a reduced format: C_OUTPUT * u_out * RMS(y), except ops
  that only select or move values (relu, max-pool, reshapes), which are exact.

The output error adds, over nodes, each rounding's relative RMS squared times its gain to the
output (reference.py: ``gain_out`` for rounding a result, ``gain_operands`` for rounding the operands
of a dot product), assuming independent rounding errors. One operand rounding has relative RMS
C_INPUT / sqrt(2) * u (two operands give C_INPUT * u); a stored result C_OUTPUT * u.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional

from preclint.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.numerics import C_INPUT, C_OUTPUT, FORMATS, FP32, MODES, Format, Mode, autocast_policy, gaussian_max_factor

# Ops whose result is one of their inputs' values (or a plain function of it with no rounding).
EXACT_FNS = frozenset(
    """relu relu6 hardtanh max_pool identity neg abs clamp clamp_min clamp_max clip maximum minimum where
    masked_fill max min amax amin sign floor ceil round trunc dropout input output parameter getitem""".split()
)
VALUE_FREE_KINDS = frozenset({Kind.SHAPE, Kind.DECISION, Kind.COMPARE, Kind.OUTPUT})


@dataclass
class NodePrediction:
    fmt: str  # format the node's result is stored in under the mode ("fp32", "fp16", "bf16", "int")
    local: float = 0.0  # RMS absolute error the node itself adds
    overflow: bool = False  # its result (or its rounded inputs) leave the format's finite range
    received: Optional[float] = None  # RMS error predicted at its input (decision nodes)
    flip_fraction: Optional[float] = None  # decision nodes: expected fraction of decisions that change

    @property
    def rel_local(self) -> float:
        return self.local


@dataclass
class ModePrediction:
    mode: Mode
    nodes: Dict[str, NodePrediction] = field(default_factory=dict)
    output_rms: float = 0.0  # RMS of the reference output
    output_numel: int = 0
    output_error: Optional[float] = None  # RMS absolute error of the output
    finite: bool = True
    contributions: Dict[str, float] = field(default_factory=dict)  # node -> share of output error variance

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
        ranked = sorted(self.contributions.items(), key=lambda item: (-item[1], item[0]))
        return [(name, share) for name, share in ranked[:n] if share > 0]


def _widest(formats: Iterable[str]) -> str:
    formats = [f for f in formats if f != "int"]
    if not formats:
        return "int"
    if "fp32" in formats or len(set(formats)) > 1:
        return "fp32"
    return formats[0]


def node_format(node: Node, mode: Mode, input_formats: List[str]) -> str:
    out = node.out
    if out is not None and not out.is_float:
        return "int"
    if mode.low is None:
        return "fp32"
    if not mode.autocast:
        return mode.low.name
    if node.kind == Kind.INPUT or node.kind == Kind.CONSTANT:
        return "fp32"
    policy = autocast_policy(node.fn)
    if policy == "lower":
        return mode.low.name
    if policy == "fp32":
        return "fp32"
    if node.kind == Kind.CAST and "dtype" in node.attrs:
        return {"float16": "fp16", "bfloat16": "bf16"}.get(node.attrs["dtype"], "fp32")
    if node.kind == Kind.CAST and node.fn in ("half", "bfloat16"):
        return "fp16" if node.fn == "half" else "bf16"
    if node.kind == Kind.CAST and node.fn in ("float", "double"):
        return "fp32"
    # 'promote' and unlisted ops: the inputs' dtype (type promotion). Parameters enter as fp32, so an
    # unlisted op with weights (BatchNorm) keeps its activation input's dtype.
    if node.kind in (Kind.BATCHNORM, Kind.ACTIVATION, Kind.POOL) or node.params:
        return input_formats[0] if input_formats else "fp32"
    return _widest(input_formats) if input_formats else "fp32"


def local_error(node: Node, mode: Mode, fmt: str) -> float:
    out = node.out
    if out is None or not out.is_float or not out.finite or node.kind in VALUE_FREE_KINDS:
        return 0.0
    stored = FORMATS[fmt] if fmt in FORMATS and fmt != "fp32" else None
    if node.kind in DOT_PRODUCT_KINDS and (stored is not None or mode.name == "tf32"):
        terms = node.dot_rms if node.dot_rms is not None else out.rms
        rounding = C_INPUT * mode.dot_format.unit_roundoff * terms
        if stored is not None:
            rounding = math.hypot(rounding, C_OUTPUT * stored.unit_roundoff * out.rms)
        return rounding
    if stored is None or node.fn in EXACT_FNS:
        return 0.0
    return C_OUTPUT * stored.unit_roundoff * out.rms


def rounding_terms(node: Node, mode: Mode, fmt: str) -> Dict[str, float]:
    """Relative RMS of each rounding the node does under the mode: 'operands' and/or 'result'."""
    out = node.out
    terms: Dict[str, float] = {}
    if out is None or not out.is_float or not out.finite or node.kind in VALUE_FREE_KINDS:
        return terms
    stored = FORMATS[fmt] if fmt in FORMATS and fmt != "fp32" else None
    if node.kind in DOT_PRODUCT_KINDS and (stored is not None or mode.name == "tf32"):
        terms["operands"] = C_INPUT / math.sqrt(2.0) * mode.dot_format.unit_roundoff
    if stored is not None and node.fn not in EXACT_FNS:
        terms["result"] = C_OUTPUT * stored.unit_roundoff
    return terms


def _propagated(node: Node, terms: Dict[str, float], gains: Optional[tuple]) -> float:
    """Mean-square error this node's roundings put on a downstream value with the given gains."""
    gain_out, gain_operands = gains if gains is not None else (node.sensitivity or 0.0, node.attrs.get("gain_operands"))
    total = 0.0
    if "operands" in terms:
        if gain_operands is not None:
            total += terms["operands"] ** 2 * gain_operands
        elif node.out is not None and node.out.rms > 0:
            # no operand gradients (a fused module such as MultiheadAttention): the rounding of both
            # operands as a relative error of the result
            rel = math.sqrt(2.0) * terms["operands"] * (node.dot_rms or node.out.rms) / node.out.rms
            total += rel**2 * gain_out
    if "result" in terms:
        total += terms["result"] ** 2 * gain_out
    return total


def _overflows(node: Node, fmt: str, mode: Mode, input_nodes: List[Node]) -> bool:
    limit = FORMATS[fmt].max_finite if fmt in FORMATS else math.inf
    out = node.out
    if out is not None and out.is_float and out.finite and out.absmax > limit:
        return True
    if mode.low is not None and node.kind in DOT_PRODUCT_KINDS and fmt == mode.low.name:
        # the operands are cast to the reduced format before the product
        return any(s is not None and s.is_float and s.finite and s.absmax > mode.low.max_finite
                   for s in node.input_stats)
    return False


def _flip_fraction(margins: List[float], sigma: float, compare: bool) -> float:
    """Expected fraction of decisions that change when each compared value carries N(0, sigma^2) error.

    An order between two values flips when their error difference (std sigma*sqrt(2)) exceeds the
    gap; a comparison with a constant when the value's own error exceeds its distance to it.
    """
    if sigma <= 0 or not margins:
        return 0.0
    spread = sigma * (1.0 if compare else math.sqrt(2.0))
    total = sum(0.5 * math.erfc(m / (spread * math.sqrt(2.0))) for m in margins)
    return total / len(margins)


def predict_mode(graph: Graph, mode: Mode) -> ModePrediction:
    prediction = ModePrediction(mode)
    formats: Dict[str, str] = {}
    roundings: Dict[str, Dict[str, float]] = {}
    for node in graph.nodes:
        inputs = [graph[n] for n in node.inputs if graph.get(n) is not None]
        fmt = node_format(node, mode, [formats[n.name] for n in inputs if n.name in formats])
        formats[node.name] = fmt
        roundings[node.name] = rounding_terms(node, mode, fmt)
        prediction.nodes[node.name] = NodePrediction(
            fmt, local_error(node, mode, fmt), _overflows(node, fmt, mode, inputs) if graph.ran_reference else False
        )
    if not graph.ran_reference:
        prediction.output_error = None
        return prediction

    outputs = [s for node in graph.output_nodes for n in node.inputs for s in graph[n].outputs[:1] if s.is_float]
    numel = sum(s.numel for s in outputs)
    prediction.output_numel = numel
    if not numel:  # integer outputs only (labels, indices): their error is the decisions' flips
        prediction.finite = not any(p.overflow for p in prediction.nodes.values())
        _predict_decisions(graph, prediction, roundings)
        return prediction
    prediction.output_rms = math.sqrt(sum(s.rms**2 * s.numel for s in outputs) / numel) if numel else 0.0
    prediction.finite = not any(p.overflow for p in prediction.nodes.values())

    have_gains = any(n.sensitivity is not None for n in graph.nodes)
    variance = 0.0
    terms: Dict[str, float] = {}
    for node in graph.nodes:
        if not roundings[node.name]:
            continue
        if have_gains:
            term = _propagated(node, roundings[node.name], None)
        else:
            # No gradients (an op without a derivative): assume each node's relative error reaches the
            # output unamplified, and take the largest, since errors barely compound through norms.
            rel = prediction.nodes[node.name].local / node.out.rms if node.out and node.out.rms > 0 else 0.0
            term = (rel * prediction.output_rms) ** 2
        if term <= 0:
            continue
        terms[node.name] = term
        variance = variance + term if have_gains else max(variance, term)
    prediction.output_error = math.sqrt(variance)
    if variance > 0 and have_gains:
        prediction.contributions = {name: term / variance for name, term in terms.items()}

    _predict_decisions(graph, prediction, roundings)
    return prediction


def _relative_errors(graph: Graph, prediction: ModePrediction) -> Dict[str, float]:
    """Relative RMS error of every value when errors pass through ops unamplified: the fallback for
    values no gradient reaches (detached scores, integer paths). Takes the largest incoming error
    rather than their sum, since the branches of a DAG share their history."""
    rel: Dict[str, float] = {}
    for node in graph.nodes:
        incoming = max((rel.get(n, 0.0) for n in node.inputs), default=0.0)
        local = prediction.nodes[node.name].local
        own = local / node.out.rms if node.out is not None and node.out.rms > 0 else 0.0
        rel[node.name] = math.hypot(incoming, own)
    return rel


def _predict_decisions(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    fallback: Optional[Dict[str, float]] = None
    for node in graph.nodes:
        gains = node.attrs.get("upstream_gain")
        if node.margins is None:
            continue
        if gains:
            received = math.sqrt(sum(_propagated(graph[n], roundings[n], g) for n, g in gains.items() if n in roundings))
        elif node.inputs and node.input_stats and node.input_stats[0] is not None:
            fallback = fallback if fallback is not None else _relative_errors(graph, prediction)
            received = fallback.get(node.inputs[0], 0.0) * node.input_stats[0].rms
        else:
            continue
        p = prediction.nodes[node.name]
        p.received = received
        p.flip_fraction = _flip_fraction(node.margins, received, node.kind == Kind.COMPARE)


def predict(graph: Graph, modes: Iterable[str]) -> Dict[str, ModePrediction]:
    return {name: predict_mode(graph, MODES[name]) for name in modes}


def relative(value: Optional[float], scale: Optional[float]) -> Optional[float]:
    if value is None or scale is None:
        return None
    return value / scale if scale > 0 else 0.0


__all__ = ["ModePrediction", "NodePrediction", "predict", "predict_mode", "node_format", "local_error", "FP32", "Format"]
