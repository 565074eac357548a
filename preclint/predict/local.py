"""The local error of a node: what rounding its operands and its result to the format it computes in
adds, before any of it propagates.

Local error (RMS, absolute) of a node, from docs/error-model.md:

* dot products (conv, linear, matmul) with inputs rounded to u_in and fp32 accumulation:
  C_INPUT * u_in * RMS(sqrt(sum_k (a_k b_k)^2)), plus C_OUTPUT * u_out * RMS(y) when the result is
  stored in a reduced format; independent of the reduction length K;
* any other op whose result is stored in a reduced format: C_OUTPUT * u_out * RMS(y), except ops
  that only select or move values (relu, max-pool, reshapes) and clamps, where and masked_fill whose
  constants the format holds, which are exact (core/exact_ops.py);
* under the fp32 mode (``Mode.floor``: float32 against float64) every float32 result counts as
  stored in a reduced format, u = 2^-24; a dot product's operands are float32 already (the weights
  exactly, the activations as their producers rounded them), so its error is float32's
  accumulation, FLOAT32_ACCUMULATION of its terms (it grows with the reduction length K), with the
  rounding of the result; values entering the graph (inputs, parameters) are exact.
"""
from __future__ import annotations

import math
from typing import Dict

from preclint.core.exact_ops import exact_node
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind, Node
from preclint.core.numerics import C_INPUT, C_OUTPUT, FORMATS, Format, Mode
from preclint.predict.accumulation import accumulation_error, float32_accumulation, terms_rms
from preclint.predict.scaled import scaled_operand_rounding
from preclint.predict.tf32 import tensor_core_tf32
from preclint.reference.analyses.exact_rounding import measured_rounding
from preclint.reference.analyses.gains import Gains

VALUE_FREE_KINDS = frozenset({Kind.SHAPE, Kind.DECISION, Kind.COMPARE, Kind.OUTPUT})

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


def exact_result(node: Node, fmt: str) -> bool:
    """Whether storing the node's result in ``fmt`` rounds nothing: an op exact in it (core/exact_ops.py),
    or a value entering the graph (its rounding on entry is the caller's to count: plan/planner.py)."""
    return node.kind == Kind.INPUT or exact_node(node, fmt)


def result_rounding(node: Node, fmt: str, stored: Format) -> float:
    """Relative RMS error of storing the node's result in ``fmt``: C_OUTPUT * u for values in the normal
    range, plus what the kernel's accumulation adds, plus the absolute step of the subnormal range:
    values below the smallest normal keep a fixed absolute resolution (2^-24 in float16), and values
    far below it become 0 (vanishing activations of deep random-init nets: a relative error of 1)."""
    # (a dot product's accumulation scales with its terms, not its result: rounds_operands adds it)
    accumulation = accumulation_error(node, fmt) if node.kind not in DOT_PRODUCT_KINDS else 0.0
    # (a probability's rounding is measured: saturated ones round by far less than C_OUTPUT u; so is
    # that of values on the format's grid, whole pixels)
    rounding = measured_rounding(node, fmt, stored.unit_roundoff)
    relative = math.hypot(C_OUTPUT * stored.unit_roundoff if rounding is None else rounding, accumulation)
    rms = node.out.rms if node.out is not None else 0.0
    if stored.min_subnormal and rms > 0 and rms < stored.min_normal:
        relative = math.hypot(relative, min(1.0, stored.min_subnormal / math.sqrt(12.0) / rms))
    return relative


def stored_format(node: Node, mode: Mode, fmt: str):
    """The format whose rounding of the node's result counts under ``mode``: a reduced one it stores
    in, float32 under the fp32 mode (its floor), else None (float32 counts as exact)."""
    if fmt not in FORMATS:
        return None
    if fmt != "fp32":
        return FORMATS[fmt]
    if mode.floor and node.kind not in (Kind.INPUT, Kind.CONSTANT) and node.fn != "parameter":
        return FORMATS[fmt]
    return None


def floor_dot(node: Node, mode: Mode, fmt: str) -> bool:
    """A dot product the fp32 mode computes in float32: its operands round nothing, its sum does."""
    return mode.floor and fmt == "fp32" and node.kind in DOT_PRODUCT_KINDS


def rounds_operands(node: Node, mode: Mode, stored, fmt: str = "") -> bool:
    """Whether a dot product rounds its operands under ``mode``: to the reduced format when it computes
    in it, and under tf32 where the backend uses TF32 tensor cores for it (tensor_core_tf32); never
    in float32 under the fp32 mode (floor_dot)."""
    if node.kind not in DOT_PRODUCT_KINDS or floor_dot(node, mode, fmt):
        return False
    if stored is not None:
        return True
    return mode.kernel_choice_matters and tensor_core_tf32(node, float32_backend=mode.backend_float32)


def operand_rounding(node: Node, fmt: Format) -> float:
    """Relative RMS error of rounding a dot product's two operands to ``fmt`` (C_INPUT * u); an
    activation below the format's normal range keeps only the absolute subnormal step (float16)."""
    relative = C_INPUT * fmt.unit_roundoff
    activation = node.input_stats[0] if node.input_stats else None
    if fmt.min_subnormal and activation is not None and activation.is_float and 0 < activation.rms < fmt.min_normal:
        relative = math.hypot(relative, min(1.0, fmt.min_subnormal / math.sqrt(12.0) / activation.rms))
    return relative


def local_error(node: Node, mode: Mode, fmt: str) -> float:
    out = node.out
    if out is None or not out.is_float or not out.finite or node.kind in VALUE_FREE_KINDS:
        return 0.0
    if node.kind not in DOT_PRODUCT_KINDS and exact_integers(node, fmt):
        return 0.0
    stored = stored_format(node, mode, fmt)
    if floor_dot(node, mode, fmt):
        terms = terms_rms(node)
        terms = out.rms if terms is None else terms
        return math.hypot(float32_accumulation(node) * terms, C_OUTPUT * stored.unit_roundoff * out.rms)
    if rounds_operands(node, mode, stored, fmt):
        terms = terms_rms(node)
        terms = out.rms if terms is None else terms
        scaled = scaled_operand_rounding(node, mode)
        operands = operand_rounding(node, stored or mode.dot_format) if scaled is None else scaled
        rounding = math.hypot(operands, accumulation_error(node, fmt)) * terms
        if stored is not None:
            rounding = math.hypot(rounding, C_OUTPUT * stored.unit_roundoff * out.rms)
        return rounding
    if stored is None or exact_result(node, fmt):
        return 0.0
    return result_rounding(node, fmt, stored) * out.rms


def rounding_terms(node: Node, mode: Mode, fmt: str) -> Dict[str, float]:
    """Relative RMS of each rounding the node does under the mode: 'operands' and/or 'result'."""
    out = node.out
    terms: Dict[str, float] = {}
    if out is None or not out.is_float or not out.finite or node.kind in VALUE_FREE_KINDS:
        return terms
    stored = stored_format(node, mode, fmt)
    if floor_dot(node, mode, fmt) and float32_accumulation(node):
        terms["accumulation"] = float32_accumulation(node)
    if rounds_operands(node, mode, stored, fmt):
        scaled = scaled_operand_rounding(node, mode)
        operands = operand_rounding(node, stored or mode.dot_format) if scaled is None else scaled
        terms["operands"] = operands / math.sqrt(2.0)
        if accumulation_error(node, fmt):  # an error of the sum itself, relative to its terms
            terms["accumulation"] = accumulation_error(node, fmt)
    if stored is not None and not exact_result(node, fmt) and not (node.kind not in DOT_PRODUCT_KINDS
                                                                 and exact_integers(node, fmt)):
        terms["result"] = result_rounding(node, fmt, stored)
        gains = node.record(Gains)
        exact = gains.rounding.get(fmt) if gains is not None else None
        if exact is not None:  # a constant: its rounding errors are known, already weighed by its gains
            terms["result_to_output"] = exact
    return terms
