"""The error model: per node and precision mode, the dtype it computes in, its local rounding error,
whether it leaves the format's range, and the error that reaches the output.

Local error (RMS, absolute) of a node, from docs/error-model.md:

* dot products (conv, linear, matmul) with inputs rounded to u_in and fp32 accumulation:
  C_INPUT * u_in * RMS(sqrt(sum_k (a_k b_k)^2)), plus C_OUTPUT * u_out * RMS(y) when the result is
  stored in a reduced format; independent of the reduction length K;
* any other op whose result is stored in a reduced format: C_OUTPUT * u_out * RMS(y), except ops
  that only select or move values (relu, max-pool, reshapes), which are exact.

The output error adds, over nodes, each rounding's relative RMS squared times its gain to the
output (Gains, of reference/analyses/gains.py: ``out`` for rounding a result, ``operands`` for rounding the
operands of a dot product), assuming independent rounding errors. One operand rounding has relative RMS
C_INPUT / sqrt(2) * u (two operands give C_INPUT * u); a stored result C_OUTPUT * u.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import AbstractSet, Dict, Iterable, List, Optional

from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.reference.analyses.batchnorm import BatchNormFolding
from preclint.reference.analyses.contraction import Contraction
from preclint.reference.analyses.decision_gains import DecisionGains
from preclint.reference.analyses.margins import DecisionMargins, RoundingMargins
from preclint.reference.analyses.gains import Gains
from preclint.reference.analyses.reach import Reach
from preclint.reference.analyses.received_gains import ReceivedGains
from preclint.reference.analyses.terms import Terms
from preclint.core.numerics import (C_INPUT, C_OUTPUT, DTYPE_FORMATS, FORMATS, FP32, MODES, PROMOTING_BATCHNORMS, Format, Mode,
                               autocast_format, autocast_policy, casting_region, gaussian_max_factor)

# Ops whose result is one of their inputs' values (or a plain function of it with no rounding).
EXACT_FNS = frozenset(
    """relu relu6 hardtanh max_pool identity neg abs clamp clamp_min clamp_max clip maximum minimum where
    masked_fill max min amax amin sign floor ceil round trunc dropout input output getitem""".split()
)
VALUE_FREE_KINDS = frozenset({Kind.SHAPE, Kind.DECISION, Kind.COMPARE, Kind.OUTPUT})

# The records the error figures read (local, received and output errors, contributions, flips):
# computed wherever errors are predicted, whatever the rules selected read themselves.
PREDICTED_ERRORS_NEED = (Terms, Contraction, Gains, Reach, DecisionMargins, RoundingMargins, DecisionGains)

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
    # amplifiers (ReceivedGains): input node -> the relative RMS error it reaches the node with
    inputs_received: Dict[str, float] = field(default_factory=dict)


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


def _widest(formats: Iterable[str]) -> str:
    formats = [f for f in formats if f != "int"]
    if not formats:
        return "int"
    if "fp32" in formats or len(set(formats)) > 1:
        return "fp32"
    return formats[0]


_FX_CONSTANT = re.compile(r"(^|\.)_tensor_constant\d+$")


def fx_tensor_constant(node: Node) -> bool:
    """A tensor the forward creates (``torch.arange(n)`` of a size the trace fixed), which torch.fx
    stores as an attribute of its own (``_tensor_constant0``): not the model's, so ``model.to``
    never casts it; it keeps the dtype the forward gives it. (Not a view of the model's own
    tensor, ``attrs["view_of"]``: that one is cast.)"""
    return (node.fn == "parameter" and bool(node.params) and bool(_FX_CONSTANT.search(node.params[0]))
            and not node.attrs.get("view_of"))


def node_format(node: Node, mode: Mode, input_formats: List[str]) -> str:
    """The format the node's result is stored in under ``mode``, from the formats of its inputs and
    the autocast state at the node: the mode's, or the one the model's code set around it
    (``Node.autocast``: ``torch.autocast(enabled=False)``, a region with its own dtype)."""
    out = node.out
    if out is not None and not out.is_float:
        return "int"
    # a float made from integers (an embedding lookup, a cast of token ids) takes its format from the
    # float inputs it has, else from the mode
    input_formats = [f for f in input_formats if f != "int"]
    low = autocast_format(node.autocast, mode)
    if mode.low is None and low is None:
        return "fp32"
    if node.kind in (Kind.REDUCTION, Kind.SCAN, Kind.SOFTMAX) and node.attrs.get("dtype") in DTYPE_FORMATS:
        return DTYPE_FORMATS[node.attrs["dtype"]]  # sum(x, dtype=torch.float32) accumulates and returns fp32
    if low is not None and node.kind not in (Kind.INPUT, Kind.CONSTANT):
        policy = autocast_policy(node.fn)
        if policy == "lower":
            return low.name
        if policy == "fp32":
            return "fp32"
    cast_model = mode.low is not None and not mode.autocast
    if cast_model and (node.kind == Kind.INPUT or node.params and not fx_tensor_constant(node)):
        return mode.low.name  # model.to(dtype): parameters, buffers and inputs are cast
    if node.kind == Kind.INPUT or node.fn == "parameter":
        return "fp32"
    if node.kind == Kind.CONSTANT:
        # a tensor the forward creates keeps the dtype it is created with: float32 unless made like
        # another tensor or given a dtype
        if node.fn.endswith("_like") or node.fn.startswith("new_"):
            return input_formats[0] if input_formats else (mode.low.name if cast_model else "fp32")
        return DTYPE_FORMATS.get(node.attrs.get("dtype"), "fp32")
    cast = _explicit_cast(node, input_formats)
    if cast is not None:
        return cast
    if node.kind == Kind.ELEMENTWISE and node.attrs.get("float_constant"):
        # it reads a parameter or buffer of at least one dim directly (capture.py), held in float32 under
        # autocast and in the low format in a cast model: type promotion takes the wider
        input_formats = input_formats + [mode.low.name if cast_model else "fp32"]
    # 'promote' and unlisted ops, and every op where autocast is off: the inputs' dtype (type
    # promotion). Parameters enter as fp32 under autocast, so an unlisted op with weights
    # (BatchNorm) keeps its activation input's dtype; in a cast model they hold the low format.
    if not cast_model and node.kind == Kind.BATCHNORM and node.module_type in PROMOTING_BATCHNORMS:
        return "fp32"
    if not cast_model and (node.kind in (Kind.BATCHNORM, Kind.ACTIVATION, Kind.POOL) or node.params):
        return input_formats[0] if input_formats else "fp32"
    return _widest(input_formats) if input_formats else (mode.low.name if cast_model else "fp32")


def _explicit_cast(node: Node, input_formats: List[str]) -> Optional[str]:
    """The format an explicit cast asks for (.float(), .half(), .to(dtype), .type_as(other))."""
    if node.kind != Kind.CAST:
        return None
    if "dtype" in node.attrs:
        return DTYPE_FORMATS.get(node.attrs["dtype"], "fp32")
    if node.fn in ("half", "bfloat16", "float", "double"):
        return DTYPE_FORMATS[node.fn]
    if node.fn == "type_as" and len(input_formats) > 1:
        return input_formats[1]
    return None


def input_formats(graph: Graph, node: Node, mode: Mode, formats: Dict[str, str]) -> List[str]:
    """The formats the node reads its inputs in: as their producers stored them, except where a
    ``custom_fwd(cast_inputs=...)`` forward casts what comes from outside it (when autocast is on
    around the forward)."""
    region = casting_region(node.autocast, mode)
    if region is None:
        return [formats[n] for n in node.inputs if n in formats]
    cast = DTYPE_FORMATS.get(region.cast_inputs, "fp32")
    return [cast if formats[n] in FORMATS and not region.encloses(graph[n].autocast) else formats[n]
            for n in node.inputs if n in formats]


# Arithmetic that maps whole numbers to whole numbers; exact in a format while they stay below its
# exact-integer limit (positions, counts and coordinates computed this way carry no rounding error).
INTEGER_EXACT_FNS = frozenset("add sub rsub mul neg abs floordiv fmod remainder cumsum sum".split())


def exact_integers(node: Node, fmt: str) -> bool:
    """Whether the node computes whole numbers from whole numbers, exactly representable in ``fmt``."""
    out = node.out
    if out is None or not out.integer_valued or fmt not in FORMATS:
        return False
    if node.fn not in INTEGER_EXACT_FNS and node.kind not in (Kind.CAST, Kind.CONSTANT):
        return False
    inputs_whole = all(s is None or not s.is_float or s.integer_valued or s.absmax == 0 for s in node.input_stats)
    return inputs_whole and out.absmax <= FORMATS[fmt].exact_integers_to


def result_rounding(node: Node, fmt: str, stored: Format) -> float:
    """Relative RMS error of storing the node's result in ``fmt``: C_OUTPUT * u for values in the normal
    range, plus what the kernel's accumulation adds, plus the absolute step of the subnormal range:
    values below the smallest normal keep a fixed absolute resolution (2^-24 in float16), and values
    far below it become 0 (vanishing activations of deep random-init nets: a relative error of 1)."""
    # (a dot product's accumulation scales with its terms, not its result: rounds_operands adds it)
    accumulation = accumulation_error(node, fmt) if node.kind not in DOT_PRODUCT_KINDS else 0.0
    relative = math.hypot(C_OUTPUT * stored.unit_roundoff, accumulation)
    rms = node.out.rms if node.out is not None else 0.0
    if stored.min_subnormal and rms > 0 and rms < stored.min_normal:
        relative = math.hypot(relative, min(1.0, stored.min_subnormal / math.sqrt(12.0) / rms))
    return relative


def contraction(node: Node) -> Contraction:
    """How the dot product accumulates (a plain sum where the reference pass did not say)."""
    return node.record(Contraction) or Contraction()


def terms_rms(node: Node) -> Optional[float]:
    """The RMS of the terms a dot product or sum adds up, where the reference pass measured it."""
    terms = node.record(Terms)
    return terms.rms if terms is not None else None


def tensor_core_tf32(node: Node) -> bool:
    """Whether the backend runs the dot product on TF32 tensor cores when TF32 is on. On an H200
    (torch 2.11, cuBLAS, cuDNN 9.19; probe_h200_agree.json in benchmarks/CLAIMS.md) these ran in plain fp32 instead:
    products with a single row (matrix-vector: cuBLAS gemv; a classifier on one image, an SE block's
    1x1 convs on pooled features), depthwise convs, and convs that read fewer than 4 channels per
    group (an RGB stem, a patch embedding). An einsum that contracts nothing is an elementwise
    product. Other shapes are left to the backend's heuristics, which the probe measures."""
    if not contraction(node).contracts:
        return False
    out = node.out
    shape = out.shape if out is not None else ()
    if node.kind == Kind.CONV and len(shape) >= 3:
        rows = out.numel // max(1, shape[1])  # batch x output positions
        in_channels = node.attrs.get("in_channels")
        groups = node.groups or 1
        if in_channels is None and len(node.input_stats) > 0 and node.input_stats[0] is not None:
            in_channels = node.input_stats[0].shape[1] if len(node.input_stats[0].shape) > 1 else None
        if in_channels is not None and (in_channels // groups < 4 or (groups > 1 and groups == in_channels)):
            return False
        return rows > 1
    if node.kind == Kind.LINEAR and shape:
        return out.numel // max(1, shape[-1]) > 1
    if node.kind == Kind.MATMUL and len(shape) >= 2 and node.fn in ("matmul", "mm", "bmm", "baddbmm"):
        return shape[-2] > 1 and shape[-1] > 1
    return True


def rounds_operands(node: Node, mode: Mode, stored) -> bool:
    """Whether a dot product rounds its operands under ``mode``: to the reduced format when it computes
    in it, and under tf32 where the backend uses TF32 tensor cores for it (tensor_core_tf32)."""
    if node.kind not in DOT_PRODUCT_KINDS:
        return False
    if stored is not None:
        return True
    return mode.name == "tf32" and tensor_core_tf32(node)


def operand_rounding(node: Node, fmt: Format) -> float:
    """Relative RMS error of rounding a dot product's two operands to ``fmt`` (C_INPUT * u); an
    activation below the format's normal range keeps only the absolute subnormal step (float16)."""
    relative = C_INPUT * fmt.unit_roundoff
    activation = node.input_stats[0] if node.input_stats else None
    if fmt.min_subnormal and activation is not None and activation.is_float and 0 < activation.rms < fmt.min_normal:
        relative = math.hypot(relative, min(1.0, fmt.min_subnormal / math.sqrt(12.0) / activation.rms))
    return relative


# How CUDA kernels accumulate sums, products and scans of float16/bfloat16 inputs: (a, p) of an
# accumulation error of a * u * n**p (relative RMS) over a length n; absent means float32
# accumulation, whose only error is rounding the result. Measured on an H200 with torch 2.11
# (benchmarks/accuracy.py measure --accumulation, h200.json in benchmarks/CLAIMS.md): sum, mean and prod
# accumulate in float32 at every length; cumsum carries its running sum in the reduced format between
# blocks, fitted over n = 256 ... 65536 within 1.5x (positive terms over 10^6 stagnate, 10x more);
# cumprod keeps its running product in the reduced format, which rounds at every step: sqrt(n/3) u,
# more when the factors lie within a few u of 1 (then products stagnate).
LOW_PRECISION_ACCUMULATION: Dict[str, tuple] = {"cumsum": (0.163, 0.37), "cumprod": (1 / math.sqrt(3.0), 0.5)}
# float16 GEMMs with torch.backends.cuda.matmul.allow_fp16_accumulation = True, same form over the
# reduction length K (H200, K = 64 ... 16384: 0.66, 1.33, 2.62 u in all against 0.43 u without).
FP16_GEMM_ACCUMULATION = (0.15, 0.29)
PRODUCTS = frozenset({"prod", "cumprod"})


def accumulation_error(node: Node, fmt: str) -> float:
    """Relative RMS error that the kernel of a reduction or scan of length n adds in ``fmt`` by keeping
    its partial results there, beyond rounding its result; 0 where it accumulates in float32. (The
    rounding of a product's n factors compounds as sqrt(n) of theirs: the gradients carry that.)"""
    if node.kind in DOT_PRODUCT_KINDS:
        law = FP16_GEMM_ACCUMULATION if contraction(node).fp16_accumulation and fmt == "fp16" else None
    else:
        law = LOW_PRECISION_ACCUMULATION.get(node.fn)
    if law is None or fmt not in ("fp16", "bf16"):
        return 0.0
    n = node.reduction_length or 1
    return law[0] * FORMATS[fmt].unit_roundoff * n ** law[1]


def local_error(node: Node, mode: Mode, fmt: str) -> float:
    out = node.out
    if out is None or not out.is_float or not out.finite or node.kind in VALUE_FREE_KINDS:
        return 0.0
    if node.kind not in DOT_PRODUCT_KINDS and exact_integers(node, fmt):
        return 0.0
    stored = FORMATS[fmt] if fmt in FORMATS and fmt != "fp32" else None
    if rounds_operands(node, mode, stored):
        terms = terms_rms(node)
        terms = out.rms if terms is None else terms
        rounding = math.hypot(operand_rounding(node, stored or mode.dot_format), accumulation_error(node, fmt)) * terms
        if stored is not None:
            rounding = math.hypot(rounding, C_OUTPUT * stored.unit_roundoff * out.rms)
        return rounding
    if stored is None or node.fn in EXACT_FNS:
        return 0.0
    return result_rounding(node, fmt, stored) * out.rms


def rounding_terms(node: Node, mode: Mode, fmt: str) -> Dict[str, float]:
    """Relative RMS of each rounding the node does under the mode: 'operands' and/or 'result'."""
    out = node.out
    terms: Dict[str, float] = {}
    if out is None or not out.is_float or not out.finite or node.kind in VALUE_FREE_KINDS:
        return terms
    stored = FORMATS[fmt] if fmt in FORMATS and fmt != "fp32" else None
    if rounds_operands(node, mode, stored):
        terms["operands"] = operand_rounding(node, stored or mode.dot_format) / math.sqrt(2.0)
        if accumulation_error(node, fmt):  # an error of the sum itself, relative to its terms
            terms["accumulation"] = accumulation_error(node, fmt)
    if stored is not None and node.fn not in EXACT_FNS and not (node.kind not in DOT_PRODUCT_KINDS
                                                                 and exact_integers(node, fmt)):
        terms["result"] = result_rounding(node, fmt, stored)
        gains = node.record(Gains)
        exact = gains.rounding.get(fmt) if gains is not None else None
        if exact is not None:  # a constant: its rounding errors are known, already weighed by its gains
            terms["result_to_output"] = exact
    return terms


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
    if "result_to_output" in terms and gains is None:
        total += terms["result_to_output"]
    elif "result" in terms:
        total += terms["result"] ** 2 * gain_out
    return total


# torch.finfo(x.dtype).min/.max/.tiny/.eps as the fp32 reference run sees them: a model that builds its
# constants from the dtype gets the reduced format's own values under a reduced precision.
DTYPE_DERIVED = frozenset({FP32.max_finite, FP32.min_normal, 2.0**-23})
FILL_FNS = frozenset({"masked_fill", "where", "full", "full_like", "new_full", "clamp", "clamp_min", "clamp_max", "clip"})
# PyTorch converts these ops' scalar to the tensor's dtype with a range check: out of range, it raises
# "value cannot be converted to type c10::Half without overflow" instead of storing inf.
CHECKED_CONVERSION = frozenset({"masked_fill", "full", "full_like", "new_full", "clamp", "clip", "clamp_min", "clamp_max"})


def dtype_derived(value: float) -> bool:
    return abs(value) in DTYPE_DERIVED


def reaching_absmax(node: Node) -> float:
    """The largest magnitude of the node's value that the output depends on: what the model masks
    (``where``, ``masked_fill``) or softmax turns into exact zeros (a finfo.min mask) does not count."""
    out = node.out
    if out is None or not out.is_float:
        return 0.0
    reach = node.record(Reach)
    return reach.absmax if reach is not None else out.absmax


def _overflows(node: Node, fmt: str, mode: Mode, input_nodes: List[Node]) -> bool:
    limit = FORMATS[fmt].max_finite if fmt in FORMATS else math.inf
    out = node.out
    if node.fn in CHECKED_CONVERSION and any(limit < abs(v) < math.inf and not dtype_derived(v) for v in node.scalars.values()):
        return True  # converting its constant raises: the run fails, whichever elements it fills
    if out is not None and out.is_float and out.finite and reaching_absmax(node) > limit:
        derived = node.fn in FILL_FNS and any(dtype_derived(v) for v in node.scalars.values())
        return not (derived and out.absmax >= FP32.max_finite)
    if node.kind in DOT_PRODUCT_KINDS and fmt in ("fp16", "bf16"):
        # the operands are cast to the reduced format before the product
        if input_nodes:
            return any(n.out is not None and n.out.finite and reaching_absmax(n) > limit for n in input_nodes)
        return any(s is not None and s.is_float and s.finite and s.absmax > limit for s in node.input_stats)
    return False


# the operand of each op that a zero turns into inf or NaN
POLE_OPERAND = {"div": 1, "true_divide": 1, "rsqrt": 0, "reciprocal": 0, "log": 0, "log2": 0, "log10": 0}
# ops whose result is 0 where an operand is
ZERO_KEEPING = frozenset({"sqrt", "mul", "abs", "neg", "pow", "square", "relu", "identity", "getitem"})


def _mark_poles(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    """Underflow to zero: a value whose smallest nonzero elements round to 0 in its format (below half
    the smallest subnormal: 3e-8 in float16), carried through ops that keep zeros, makes a division,
    rsqrt or log that reads it inf or NaN (a variance of tiny activations, an eps that is 0 too)."""
    zeroed: Dict[str, bool] = {}
    for node in graph.nodes:
        p = prediction.nodes[node.name]
        out = node.out
        flushed = False
        if "result" in roundings.get(node.name, {}) and p.fmt in FORMATS and out is not None and out.finite:
            flushed = 0 < out.absmin_nonzero < FORMATS[p.fmt].min_subnormal / 2
        carried = (node.kind == Kind.SHAPE or node.fn in ZERO_KEEPING) and any(zeroed.get(n) for n in node.inputs)
        zeroed[node.name] = flushed or carried
        position = POLE_OPERAND.get(node.fn)
        if position is None or not node.inputs:
            continue
        if node.fn in ("div", "true_divide") and len(node.inputs) == 1:
            # one tensor operand: the divisor when the numerator is the scalar (`1 / t`)
            position = 1 if ("arg1" in node.scalars or "other" in node.scalars) else 0
        if position < len(node.inputs) and zeroed.get(node.inputs[position]):
            p.pole = True
    if not prediction.mode.autocast:
        for node in graph.nodes:
            if node.kind == Kind.BATCHNORM and _variance_flushes(node, prediction.nodes[node.name].fmt):
                prediction.nodes[node.name].pole = True


def _variance_flushes(node: Node, fmt: str) -> bool:
    """A batch norm module of a cast model holds its running variance in the model's format: where it is
    below half the smallest subnormal (1e-9 in float16) and eps is 0 too, the rsqrt inside the module
    makes an infinite scale. (Under autocast its buffers stay float32.)"""
    facts = node.record(BatchNormFolding)
    if facts is None or fmt not in FORMATS or not node.params:
        return False
    return 0 <= facts.var_min + facts.eps < FORMATS[fmt].min_subnormal / 2


def expected_flip_fraction(margins: List[float], sigma: float, compare: bool) -> float:
    """Expected fraction of decisions that change when each compared value carries N(0, sigma^2) error.

    An order between two values flips when their error difference (std sigma*sqrt(2)) exceeds the
    gap; a comparison with a constant when the value's own error exceeds its distance to it.
    """
    if sigma <= 0 or not margins:
        return 0.0
    spread = sigma * (1.0 if compare else math.sqrt(2.0))
    total = sum(0.5 * math.erfc(m / (spread * math.sqrt(2.0))) for m in margins)
    return total / len(margins)


def predict_mode(graph: Graph, mode: Mode, float32: AbstractSet[str] = frozenset(),
                 cast_back: AbstractSet[str] = frozenset()) -> ModePrediction:
    """``float32``: nodes a mixed-precision plan computes in float32 (autocast off, float32 operands);
    ``cast_back``: those of them whose result the plan stores back in the low format."""
    prediction = ModePrediction(mode)
    formats: Dict[str, str] = {}
    roundings: Dict[str, Dict[str, float]] = {}
    for node in graph.nodes:
        inputs = [graph[n] for n in node.inputs if graph.get(n) is not None]
        fmt = node_format(node, mode, input_formats(graph, node, mode, formats))
        if node.name in float32 and fmt in FORMATS:
            fmt = "fp32"
        formats[node.name] = fmt
        roundings[node.name] = rounding_terms(node, mode, fmt)
        prediction.nodes[node.name] = NodePrediction(
            fmt, local_error(node, mode, fmt), _overflows(node, fmt, mode, inputs) if graph.ran_reference else False
        )
        if float32 and node.name not in float32 and node.params and not mode.autocast and fmt == getattr(mode.low, "name", ""):
            # a layer of a cast model casts a kept (float32) input down to its own dtype
            prediction.nodes[node.name].overflow |= graph.ran_reference and any(
                formats.get(i.name) == "fp32" and reaching_absmax(i) > mode.low.max_finite for i in inputs)
        if node.name in cast_back and fmt == "fp32" and mode.low is not None and node.out is not None:
            formats[node.name] = mode.low.name
            roundings[node.name]["result"] = result_rounding(node, mode.low.name, mode.low)
            prediction.nodes[node.name].local = roundings[node.name]["result"] * node.out.rms
            prediction.nodes[node.name].overflow |= graph.ran_reference and reaching_absmax(node) > mode.low.max_finite
    if not graph.ran_reference:
        prediction.output_error = None
        return prediction
    _mark_poles(graph, prediction, roundings)

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
    variance = 0.0
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
        terms[node.name] = term
        variance = variance + term if have_gains else max(variance, term)
    # The model is linear in the errors, the real error is not: it saturates (SATURATION).
    prediction.output_error = min(math.sqrt(variance), SATURATION * prediction.output_rms)
    if variance > 0 and have_gains:
        prediction.contributions = {name: term / variance for name, term in terms.items()}
        prediction.layers = module_calls(graph)

    _predict_decisions(graph, prediction, roundings)
    _predict_received(graph, prediction, roundings)
    return prediction


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
    not amplify the error of the activation beside it. Inputs without a gain of their own, and ops
    without gains, pass on the largest incoming error times the op's amplification (1 for a dot
    product, whose operands' error is relative to its terms). The largest rather than a sum, since the
    branches of a DAG share their history."""
    gains = node.record(Gains)
    if node.kind not in DOT_PRODUCT_KINDS and gains is not None and gains.by_input and gains.out and gains.out > 0:
        weighed = sum(rel.get(n, 0.0) ** 2 * gain / gains.out for n, gain in gains.by_input.items())
        # (an input without a gradient of its own, one the model computes under no_grad, has no gain of its own)
        rest = max((rel.get(n, 0.0) for n in node.inputs if n not in gains.by_input), default=0.0)
        rest *= amplification(node) or 1.0
        return max(math.sqrt(weighed), rest) if math.isfinite(weighed) else rest
    incoming = max((rel.get(n, 0.0) for n in node.inputs), default=0.0)
    if node.kind not in DOT_PRODUCT_KINDS:
        incoming *= amplification(node) or 1.0
    return incoming


def relative_errors(graph: Graph, prediction: ModePrediction) -> Dict[str, float]:
    """Relative RMS error of every value: what arrives from its inputs as the op passes it on
    (``passed_on``), combined with its own rounding. The fallback for values no output gradient
    reaches (detached scores, integer paths) and the error a node receives."""
    rel: Dict[str, float] = {}
    for node in graph.nodes:
        incoming = passed_on(node, rel)
        local = prediction.nodes[node.name].local
        own = local / node.out.rms if node.out is not None and node.out.rms > 0 else 0.0
        rel[node.name] = math.hypot(incoming, own)
    return rel



def _predict_decisions(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
    fallback: Optional[Dict[str, float]] = None
    for node in graph.nodes:
        decision = node.record(DecisionMargins)
        margins = decision or node.record(RoundingMargins)
        if margins is None:
            continue
        toward = node.record(DecisionGains)
        gains = toward.upstream if toward is not None else None
        if gains:
            received = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gains.items() if n in roundings))
        elif node.inputs and node.input_stats and node.input_stats[0] is not None:
            fallback = fallback if fallback is not None else relative_errors(graph, prediction)
            received = fallback.get(node.inputs[0], 0.0) * node.input_stats[0].rms
        else:
            continue
        p = prediction.nodes[node.name]
        p.received = received
        gap = toward.gap if toward is not None else None
        if gap:
            # the error of the margins themselves (winner minus runner-up), from a pass along that direction
            spread = math.sqrt(sum(propagated_error(graph[n], roundings[n], g) for n, g in gap.items() if n in roundings))
            p.flip_fraction = expected_flip_fraction(margins.values, spread, True)
            continue
        # a comparison or a rounding moves one value against a fixed boundary; an order, two values
        p.flip_fraction = expected_flip_fraction(margins.values, received, decision is None or node.kind == Kind.COMPARE)


def predict(graph: Graph, modes: Iterable[str]) -> Dict[str, ModePrediction]:
    return {name: predict_mode(graph, MODES[name]) for name in modes}


def relative(value: Optional[float], scale: Optional[float]) -> Optional[float]:
    if value is None or scale is None:
        return None
    return value / scale if scale > 0 else 0.0


__all__ = ["PREDICTED_ERRORS_NEED", "contraction", "terms_rms", "ModePrediction", "NodePrediction", "predict", "predict_mode", "node_format", "local_error", "amplification",
           "relative_errors", "passed_on", "exact_integers", "dtype_derived", "reaching_absmax", "accumulation_error", "FP16_GEMM_ACCUMULATION", "FP32", "Format"]
