"""The statistics of one value the reference pass records (absmax, RMS, smallest nonzero magnitude,
finiteness, whether the values are whole numbers): reduced on the device and read back at once,
or on the CPU, where reading a figure back costs no wait, in fewer passes over the values."""
from __future__ import annotations

import math
import struct
from typing import Optional, Tuple

import torch

from preclint.core.ir import TensorStats


def tensor_stats(t: torch.Tensor, *, one_readback: Optional[bool] = None) -> TensorStats:
    """The statistics of ``t``. ``one_readback``: the figures reduced on the device and read back at
    once (None: everywhere but on the CPU, where fewer passes over the values give the same figures)."""
    dtype = str(t.dtype).replace("torch.", "")
    shape = tuple(t.shape)
    if t.numel() == 0:
        return TensorStats(shape, dtype, 0)
    with torch.no_grad():
        x = t.detach()
        if not (x.is_floating_point() or x.is_complex()):
            a = x.abs().to(torch.float64) if x.dtype != torch.bool else x.to(torch.float64)
            nz = a[a != 0]
            return TensorStats(shape, dtype, x.numel(), float(a.max()), float(a.pow(2).mean().sqrt()),
                               float(nz.min()) if nz.numel() else math.inf, True, True)
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        if not x.is_complex() and not (x.device.type != "cpu" if one_readback is None else one_readback):
            found = _cpu_float_stats(x, shape, dtype)
            if found is not None:
                return found
        a = x.abs()
        # read back together, one wait for the device instead of four (the figures of the finite
        # case; the rest is recomputed below where they do not hold)
        absmax, rms, smallest, whole = torch.stack([
            a.max(), a.pow(2).mean().sqrt(), torch.where(a == 0, torch.full_like(a, math.inf), a).min(),
            (a == a.round()).all().to(a.dtype)]).tolist()
        # absmax: inf or NaN (max propagates NaN) exactly when some value is not finite
        if math.isfinite(absmax) and absmax <= 1e18:
            return TensorStats(shape, dtype, x.numel(), absmax, rms, smallest, True, absmax >= 1 and whole == 1.0)
        finite = math.isfinite(absmax)
        if not finite:
            a = a[torch.isfinite(a)]
            if a.numel() == 0:
                return TensorStats(shape, dtype, x.numel(), math.inf, math.inf, math.inf, False, False)
            absmax = float(a.max())
        # the mean square in float64 so that values near fp32's range do not overflow it
        rms = float(a.double().pow(2).mean().sqrt()) if absmax > 1e18 else float(a.pow(2).mean().sqrt())
        smallest = float(torch.where(a == 0, torch.full_like(a, math.inf), a).min())
        integer_valued = absmax >= 1 and bool((a == a.round()).all())
        return TensorStats(shape, dtype, x.numel(), absmax, rms, smallest, finite, integer_valued)


def _cpu_float_stats(x: torch.Tensor, shape: Tuple[int, ...], dtype: str) -> Optional[TensorStats]:
    """tensor_stats of a finite real tensor on the CPU, where reading a figure back costs no wait:
    fewer passes over the values than the one readback of the device's way (the same figures, bit
    for bit), or None where a value is not finite or beyond 1e18 (the general way handles those)."""
    lo, hi = (float(v) for v in torch.aminmax(x))
    absmax = max(abs(lo), abs(hi))  # NaN, and so not finite, exactly when some value is NaN
    if not (math.isfinite(absmax) and absmax <= 1e18):
        return None
    rms = float(x.pow(2).mean().sqrt())
    if lo > 0:  # no zero, all positive: the smallest magnitude is the least value
        smallest = lo
    elif hi < 0:
        smallest = -hi
    else:
        smallest = _smallest_nonzero_magnitude(x)
    whole = False
    if absmax >= 1:  # (whole numbers below 1 are all 0: not integer-valued)
        # a strided sample first: most activations show a fraction there, and need no full pass
        sample = x.reshape(-1)[::max(1, x.numel() // 64)]
        whole = bool((sample == sample.round()).all()) and bool((x == x.round()).all())
    return TensorStats(shape, dtype, x.numel(), absmax, rms, smallest, True, whole)


# a float dtype -> (the integer dtype of its width, the mask of every bit but the sign, struct's codes)
_MAGNITUDE_BITS = {torch.float32: (torch.int32, 0x7FFF_FFFF, "<i", "<f"),
                   torch.float64: (torch.int64, 0x7FFF_FFFF_FFFF_FFFF, "<q", "<d")}


def _smallest_nonzero_magnitude(x: torch.Tensor) -> float:
    """The least magnitude among the nonzero values of a finite real tensor (inf where all are zero),
    read off the bit patterns: without the sign bit, finite floats order as their bits do, and the
    bits less one (masked again) send both zeros above every other magnitude. Integer passes without
    a mask or a copy to fill, several times faster on the CPU than |x| with its zeros set to inf."""
    int_dtype, mask, int_code, float_code = _MAGNITUDE_BITS[x.dtype]
    bits = x.view(int_dtype).bitwise_and(mask)
    bits.sub_(1).bitwise_and_(mask)
    least = int(bits.min())
    if least == mask:  # every value is zero
        return math.inf
    return struct.unpack(float_code, struct.pack(int_code, least + 1))[0]
