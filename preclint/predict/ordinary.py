"""What ordinary rounding gives, for the rules and the probe's verdicts to judge against: the error
below which a figure is float32's own, the share of a training step's elements below which a fraction
is rounding residue, and the relative error ordinary rounding gives one node by itself (the error
model's, preclint.predict.local)."""
from __future__ import annotations

import math
from typing import Optional

from preclint.core.ir import DOT_PRODUCT_KINDS, Kind
from preclint.core.numerics import C_INPUT, C_OUTPUT, DTYPE_FORMATS, FORMATS, MODES
from preclint.predict.accumulation import terms_rms
from preclint.predict.local import local_error

# Errors below 2^-17.5, the geometric midpoint between float32's unit roundoff and the reduced
# formats' (2^-11 for TF32 and float16, 2^-8 for bfloat16), are float32's own: never an excess, and
# an output error that small holds no hot spot.
FLOAT32_NOISE = 2.0 ** -17.5
# A training-step figure (a flushed or lost-update fraction of a step's elements) above this share is a
# finding, and a measured one above it confirms the finding; below it, it is ordinary rounding residue.
STEP_SHARE = 0.01


def ordinary_local(node, mode_name: str, dtype: Optional[str]) -> Optional[float]:
    """The relative RMS error ordinary rounding gives ``node`` by itself under the mode, when its
    result is stored as ``dtype``: the error model's (preclint.predict), at least C_OUTPUT * u for a value
    stored in a reduced format, and for a dot product at least C_INPUT * u_in * sqrt(sum (a b)^2)
    plus the stored result's rounding, as if the backend rounded its operands (TF32 included), so that
    a backend's choice between kernels never reads as an excess. None without reference statistics."""
    out = node.out
    mode = MODES.get(mode_name)
    if out is None or not out.rms or mode is None:
        return None
    fmt = DTYPE_FORMATS.get(dtype or "", "fp32")
    stored = C_OUTPUT * FORMATS[fmt].unit_roundoff if fmt != "fp32" else 0.0
    ordinary = max(local_error(node, mode, fmt) / out.rms, stored)
    if node.kind == Kind.INPUT or node.fn == "parameter":
        # a weight or input stored in float32 is still rounded where a conv or matmul reads it (TF32)
        ordinary = max(ordinary, C_OUTPUT * mode.dot_format.unit_roundoff)
    if node.kind in DOT_PRODUCT_KINDS:
        terms = (terms_rms(node) or out.rms) / out.rms
        ordinary = max(ordinary, math.hypot(C_INPUT * mode.dot_format.unit_roundoff * terms, stored))
    return ordinary
