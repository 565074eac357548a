"""Rounding float32 values to the reduced formats, for emulating them on any device.

Each function returns a tensor of the input's dtype whose values are representable in the target
format, so that arithmetic on them in float32 is what hardware does after reading operands in that
format and accumulating in float32.
"""
from __future__ import annotations

import torch

LOW_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
REDUCED_FLOATS = (torch.float16, torch.bfloat16)


def round_tf32(t: torch.Tensor) -> torch.Tensor:
    """float32 -> float32 with TF32's 10 explicit mantissa bits (round to nearest, ties to even).

    Tensor cores read float32 operands this way in TF32 mode. The 13 low mantissa bits are cleared
    after adding half a unit (plus the kept bit, for ties), on the integer view of the bits; a carry
    into the exponent is the correct rounding up (to inf past TF32's largest value). Infinities and
    the canonical NaN have zero low bits and pass through unchanged.
    """
    if t.dtype != torch.float32:
        return t
    bits = t.contiguous().view(torch.int32)
    out = bits >> 13
    out &= 1
    out += bits
    out += 0xFFF
    out &= ~0x1FFF
    return out.view(torch.float32)


def round_to(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values of ``t`` rounded to ``dtype`` (nearest even, overflow to inf), kept in t's dtype."""
    if not t.is_floating_point() or t.dtype == dtype:
        return t
    return t.to(dtype).to(t.dtype)
