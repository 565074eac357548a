"""The error of a scaled GEMM (FP8, MXFP8, NVFP4) from the reference statistics: a linear layer the
mode's recipe converts rounds its operands by the recipe's quantisation, whose error relative to the
dot products' terms the reference pass measured (analyses/scaled_operands.py), instead of a
format's unit roundoff; its result is stored in bfloat16 as under autocast. Layers the recipe does
not convert, and every other op, run as bf16 autocast runs them.

The accumulator is taken as float32: Hopper's FP8 tensor cores keep fewer bits under
``use_fast_accum`` (about 14, DeepSeek-V3's report), which adds ~2^-14 sqrt(K/3) relative to the
terms, two orders below E4M3's operand error at the K of transformer layers."""
from __future__ import annotations

import math
from typing import Optional

from preclint.core.ir import Node
from preclint.core.numerics import C_INPUT, Mode
from preclint.reference.analyses.scaled_operands import ScaledOperands


def converted(node: Node, mode: Mode) -> bool:
    """Whether ``mode``'s recipe runs this node as a scaled GEMM: an nn.Linear call the recipe accepts."""
    if mode.recipe is None:
        return False
    record = node.record(ScaledOperands)
    return (record is not None and mode.name in record.modes and mode.name not in record.rejected
            and not mode.recipe.keeps(node.module_path))


def scaled_operand_rounding(node: Node, mode: Mode) -> Optional[float]:
    """Relative RMS error of the node's dot products from quantising both operands per ``mode``'s
    recipe (to their terms), where the recipe converts the node; else None. Infinite where a scale
    is (an all-zero group the recipe does not floor)."""
    if not converted(node, mode):
        return None
    error = node.record(ScaledOperands).combined(mode.name)
    if error is None:
        return C_INPUT * mode.recipe.element.unit_roundoff
    return error if math.isfinite(error) else math.inf
