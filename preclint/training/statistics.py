"""What a low-precision format does to the values of a training step, counted element by element.

Each function takes float tensors (any dtype; float64 from a reference step, or the low-precision values
themselves) and a torch dtype, and returns counts or fractions as Python numbers. The same primitives serve
the prediction (float64 values, the format applied analytically), the measurement (low-precision values
against float64 ones) and a monitor (values of a live run).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

LOW_DTYPES = (torch.float16, torch.bfloat16)


def flush_threshold(dtype: torch.dtype) -> float:
    """The magnitude below which round-to-nearest stores 0 in ``dtype``: half its smallest subnormal
    (exactly half rounds to even, which is 0 too)."""
    info = torch.finfo(dtype)
    mantissa_bits = round(-math.log2(info.eps))  # fp16: 10, bf16: 7, fp32: 23
    return float(info.smallest_normal) * 2.0 ** -mantissa_bits / 2


def smallest_subnormal(dtype: torch.dtype) -> float:
    return 2 * flush_threshold(dtype)


def flushes(values: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Where ``values * scale`` is nonzero but rounds to 0 in ``dtype`` (a bool tensor)."""
    magnitude = values.detach().abs().double() * scale
    return (magnitude > 0) & (magnitude <= flush_threshold(dtype))


def overflows(values: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
    """Where ``values * scale`` is finite but rounds to inf in ``dtype``: at or above the largest finite
    value plus half a spacing (round to nearest)."""
    info = torch.finfo(dtype)
    limit = float(info.max) * (1 + float(info.eps) / 4)
    magnitude = values.detach().abs().double() * scale
    return torch.isfinite(magnitude) & (magnitude >= limit)


def underflow_fraction(values: torch.Tensor, dtype: torch.dtype, scale: float = 1.0) -> float:
    """The fraction of the nonzero elements of ``values`` that ``dtype`` stores as 0 at loss scale ``scale``."""
    nonzero = int(torch.count_nonzero(values.detach()))
    return int(flushes(values, dtype, scale).sum()) / nonzero if nonzero else 0.0


def lost_updates(weight: torch.Tensor, update: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Where a nonzero ``update`` leaves ``weight`` (stored in ``dtype``) unchanged: ``weight + update``
    rounds back to the weight, the update being under half a spacing of the weight (a bool tensor)."""
    stored = weight.detach().to(dtype)
    moved = (stored.double() + update.detach().double()).to(dtype)
    return (update.detach() != 0) & (moved == stored)


def lost_update_fraction(weight: torch.Tensor, update: torch.Tensor, dtype: torch.dtype) -> float:
    """The fraction of the nonzero elements of ``update`` that ``lost_updates`` loses."""
    nonzero = int(torch.count_nonzero(update.detach()))
    return int(lost_updates(weight, update, dtype).sum()) / nonzero if nonzero else 0.0


def unchanged_fraction(before: torch.Tensor, after: torch.Tensor, reference_update: torch.Tensor) -> float:
    """Measured lost updates: of the elements a reference (float64) step moves, the fraction a run left
    exactly as they were (``after == before``, in the run's own dtype)."""
    moved = reference_update.detach() != 0
    count = int(moved.sum())
    if not count:
        return 0.0
    return int(((after.detach() == before.detach()) & moved).sum()) / count


def nonfinite_count(values: torch.Tensor) -> int:
    return int((~torch.isfinite(values.detach())).sum()) if values.is_floating_point() else 0


def relative_error(values: torch.Tensor, reference: torch.Tensor) -> float:
    """RMS(values - reference) / RMS(reference), in float64; inf where ``values`` is not finite."""
    values, reference = values.detach().double(), reference.detach().double()
    if not bool(torch.isfinite(values).all()):
        return math.inf
    norm = float(torch.linalg.vector_norm(reference))
    difference = float(torch.linalg.vector_norm(values - reference))
    return difference / norm if norm else (0.0 if difference == 0 else math.inf)


@dataclass(frozen=True)
class Magnitudes:
    """The magnitude spread of a tensor's nonzero elements: how many there are, the smallest and the largest
    (float64), and their binary exponents' histogram (``counts[i]`` elements in [2^(low+i-1), 2^(low+i)))."""

    nonzero: int
    smallest: float
    largest: float
    low: int
    counts: Tuple[int, ...]

    def below(self, threshold: float) -> int:
        """Elements whose magnitude is below ``threshold`` (exact at powers of two; else the bins entirely below)."""
        if self.nonzero == 0 or threshold <= 0:
            return 0
        top = math.floor(math.log2(threshold))  # bins with exponent e hold values < 2^e <= threshold
        return sum(c for i, c in enumerate(self.counts) if self.low + i <= top)


def magnitudes(values: torch.Tensor) -> Magnitudes:
    flat = values.detach().reshape(-1).abs()
    flat = flat[(flat > 0) & torch.isfinite(flat)].double()
    if flat.numel() == 0:
        return Magnitudes(0, 0.0, 0.0, 0, ())
    _, exponents = torch.frexp(flat)
    low = int(exponents.min())
    counts = torch.bincount(exponents - low)
    return Magnitudes(int(flat.numel()), float(flat.min()), float(flat.max()), low, tuple(int(c) for c in counts))


def scale_window(largest: float, smallest_kept: float, dtype: torch.dtype) -> Tuple[Optional[float], Optional[float]]:
    """The loss scales (powers of two) between which gradients neither overflow nor flush in ``dtype``: (the
    smallest scale that keeps a gradient of magnitude ``smallest_kept`` above the flush threshold, the largest
    scale at which ``largest`` stays finite). None where no scale bounds it (no such value)."""
    info = torch.finfo(dtype)
    high = 2.0 ** math.floor(math.log2(float(info.max) / largest)) if largest > 0 else None
    low = 2.0 ** math.ceil(math.log2(smallest_subnormal(dtype) / smallest_kept)) if smallest_kept > 0 else None
    return low, high


def quantile_magnitude(values: torch.Tensor, fraction: float) -> float:
    """The magnitude below which ``fraction`` of the nonzero elements lie (0 where there are none)."""
    flat = values.detach().reshape(-1).abs().double()
    flat = flat[(flat > 0) & torch.isfinite(flat)]
    if flat.numel() == 0:
        return 0.0
    k = max(1, min(flat.numel(), math.ceil(fraction * flat.numel())))
    return float(torch.kthvalue(flat, k).values)


@dataclass(frozen=True)
class BlockScales:
    """Per-block amax statistics of a tensor cut into blocks of ``block`` elements along its last dimension
    (what a block-scaled format's scales are computed from): min, median and p99 of the blocks' amax, and how
    many blocks are all zero (their scale 448/amax is infinite)."""

    blocks: int
    amax_min: float
    amax_median: float
    amax_p99: float
    zero_blocks: int


def block_scales(values: torch.Tensor, block: int = 32) -> BlockScales:
    flat = values.detach().double().reshape(-1)
    pad = (-flat.numel()) % block
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    amax = flat.abs().reshape(-1, block).amax(dim=1)
    if amax.numel() == 0:
        return BlockScales(0, 0.0, 0.0, 0.0, 0)
    return BlockScales(int(amax.numel()), float(amax.min()), float(amax.median()),
                       float(torch.quantile(amax, 0.99)) if amax.numel() < 2**24 else float(amax.max()),
                       int((amax == 0).sum()))
