"""Where a value leaves its format's range: it overflows (or a constant the format cannot hold makes the
run fail), or it underflows to 0 and a division, rsqrt or log reads it."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Dict, List

from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.core.numerics import FORMATS, FP32, Mode
from preclint.reference.analyses.batchnorm import BatchNormFolding
from preclint.reference.analyses.reach import Reach

if TYPE_CHECKING:
    from preclint.predict.error_model import ModePrediction

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


def overflows(node: Node, fmt: str, mode: Mode, input_nodes: List[Node]) -> bool:
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


def mark_poles(graph: Graph, prediction: ModePrediction, roundings: Dict[str, Dict[str, float]]) -> None:
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
            if node.kind == Kind.BATCHNORM and variance_flushes(node, prediction.nodes[node.name].fmt):
                prediction.nodes[node.name].pole = True


def variance_flushes(node: Node, fmt: str) -> bool:
    """A batch norm module of a cast model holds its running variance in the model's format: where it is
    below half the smallest subnormal (1e-9 in float16) and eps is 0 too, the rsqrt inside the module
    makes an infinite scale. (Under autocast its buffers stay float32.)"""
    facts = node.record(BatchNormFolding)
    if facts is None or fmt not in FORMATS or not node.params:
        return False
    return 0 <= facts.var_min + facts.eps < FORMATS[fmt].min_subnormal / 2
