"""The statistics of one value the reference pass records (absmax, RMS, smallest nonzero magnitude,
finiteness, whether the values are whole numbers): reduced on the device and read back at once,
or on the CPU, where reading a figure back costs no wait, in fewer passes over the values."""
from __future__ import annotations

import math
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
        a = x.abs()
        smallest = float(a.masked_fill_(a == 0, math.inf).min())
    whole = False
    if absmax >= 1:  # (whole numbers below 1 are all 0: not integer-valued)
        # a strided sample first: most activations show a fraction there, and need no full pass
        sample = x.reshape(-1)[::max(1, x.numel() // 64)]
        whole = bool((sample == sample.round()).all()) and bool((x == x.round()).all())
    return TensorStats(shape, dtype, x.numel(), absmax, rms, smallest, True, whole)
