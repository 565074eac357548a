"""The ops that add no rounding error of their own: one table, read by the error model (predict/local.py)
and by the walk the probe's sweep and diff's parting both take (measure/sweep.py, adds_no_rounding).

An op is exact in a format when its result, stored in that format, is what it computes in real numbers
from its operands as they are. Two classes:

* ``ALWAYS``: it moves or selects its operands' values, or maps a value to one the format holds
  (relu, max pools, identity, dropout in eval, neg, abs, floor, ...): exact in every float format;
* ``IF_CONSTANTS_FIT``: it also writes constants of its call into the result (clamp's bounds, where's
  and masked_fill's value, fill's value): exact only where every such constant is representable in
  the format (a masked_fill with -1e9 is not in float16, which holds at most 65504).

Shape ops (views, reshapes, cat, getitem) move values too; they are told by their kind
(``Kind.SHAPE``), which each reader handles before it asks this table.
"""
from __future__ import annotations

import math
from typing import Dict, Iterable, Optional

from preclint.core.ir import Node
from preclint.core.numerics import BF16, FORMATS, FP16, FP32, Format, round_to

ALWAYS = "always"
IF_CONSTANTS_FIT = "if constants fit"

EXACTNESS: Dict[str, str] = {}


def _register(exactness: str, names: str) -> None:
    for name in names.split():
        EXACTNESS[name] = exactness


_register(ALWAYS, """relu relu_ relu6 max_pool max_pool1d max_pool2d max_pool3d adaptive_max_pool1d
    adaptive_max_pool2d adaptive_max_pool3d identity dropout neg abs maximum minimum max min amax amin sign
    floor ceil round trunc""")
# hardtanh's bounds are constants too (relu6's, 0 and 6, fit every float format)
_register(IF_CONSTANTS_FIT, """clamp clamp_ clamp_min clamp_min_ clamp_max clamp_max_ clip clip_ hardtanh
    hardtanh_ where masked_fill masked_fill_ fill fill_""")


def held_exactly(value: float, fmt: Format) -> bool:
    """Whether ``fmt`` holds ``value`` as it is (NaN and the infinities included)."""
    return math.isnan(value) or round_to(value, fmt) == value


def exact_call(fn: str, constants: Iterable[float], fmt: Optional[Format]) -> bool:
    """Whether an ``fn`` call with these scalar arguments adds no rounding to a result stored in ``fmt``
    (None: float64, which holds every Python float)."""
    exactness = EXACTNESS.get(fn)
    if exactness == ALWAYS:
        return True
    if exactness != IF_CONSTANTS_FIT:
        return False
    return fmt is None or all(held_exactly(c, fmt) for c in constants)


def exact_node(node: Node, fmt: str) -> bool:
    """Whether ``node`` adds no rounding to its result stored in the format named ``fmt`` (a key of
    FORMATS), its constants being the scalar arguments capture recorded (``Node.scalars``), as the error
    model charges rounding: a constant beyond the format's range (a -1e9 mask fill in float16) is an
    overflow at the positions it fills, which PCL102 reports, not a rounding of the whole result (charged
    so, a masked attention's fill read 4.7e34 of local error). The sweeps replay such an op
    (``exact_in_dtype``): what it does there is measured, not predicted."""
    if EXACTNESS.get(node.fn) == IF_CONSTANTS_FIT and fmt not in FORMATS:
        return False
    format_ = FORMATS.get(fmt)
    constants = [c for c in node.scalars.values()
                 if format_ is None or math.isnan(c) or math.isinf(c) or abs(c) <= format_.max_finite]
    return exact_call(node.fn, constants, format_)


# the formats of torch's float dtypes, by name (this module stays torch-free); float64: None, it
# holds every Python float
_DTYPE_FORMATS = {"torch.float16": FP16, "torch.bfloat16": BF16, "torch.float32": FP32, "torch.float64": None}


def exact_in_dtype(fn: str, constants: Iterable[float], dtype) -> bool:
    """``exact_call`` for a result stored in the torch dtype ``dtype``; of a dtype without a format
    here (float8), only the ops exact whatever their constants."""
    if str(dtype) not in _DTYPE_FORMATS:
        return EXACTNESS.get(fn) == ALWAYS
    return exact_call(fn, constants, _DTYPE_FORMATS[str(dtype)])
