"""The scale statistics of one scaled-GEMM operand (an activation, a weight, an output's gradient), the same
for a prediction (float64 values from the reference step) and a measurement (the values an emulated FP8
step quantised): the per-tensor scale, the recipe's scales (min, median, p99 over the groups that share
one), the same over blocks of BLOCK elements along the reduction, and the fractions of the nonzero values
that the recipe flushes to 0 (below half the element format's smallest subnormal after scaling) or
saturates (beyond its largest value), over the tensor and across the blocks. Under a stochastic recipe a
value below the element's smallest subnormal s becomes 0 with probability 1 - |v|/s: a prediction counts
that expectation, a measurement (``read``, the values the GEMM read) the zeros it drew."""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Dict, List, Optional

import torch

from preclint.measure.grouped import quantise_along
from preclint.measure.scaled import round_element

BLOCK = 32  # the block of the per-block figures (MX's, and what Transformer Engine's debug features log)


def _spread(values: torch.Tensor) -> List[float]:
    """[min, median, p99] of a flat tensor (empty: [nan] * 3, written as null)."""
    values = values.double()
    if values.numel() == 0:
        return [math.nan] * 3
    p99 = float(torch.quantile(values, 0.99)) if values.numel() < 2**24 else float(values.max())
    return [float(values.min()), float(values.median()), p99]


def _flushed(q, nonzero: torch.Tensor, recipe) -> torch.Tensor:
    """Per value, the probability (0 or 1 rounding to nearest) that ``recipe`` makes it 0 (float64)."""
    if not recipe.stochastic:
        return (nonzero & (q.values == 0)).double()
    share = (1 - q.scaled.abs().double() / recipe.element.min_subnormal).clamp_min(0)
    return torch.where(nonzero, share, torch.zeros_like(share))


def scale_statistics(values: torch.Tensor, recipe, dim: int = -1, read: Optional[torch.Tensor] = None) -> Dict[str, object]:
    """``values`` (any float dtype) quantised by ``recipe`` with its groups along ``dim`` (the reduction of
    the GEMM that reads it): the figures the module docstring names (``read``: what a run read)."""
    element = recipe.element
    original = values.detach()
    nearest = replace(recipe, stochastic=False)  # the scales: no draw needed
    q = quantise_along(original, nearest, dim)
    nonzero = original != 0
    count = int(nonzero.sum())
    if read is not None:
        flushed = (nonzero & (read.reshape(original.shape) == 0)).double()
    else:
        flushed = _flushed(q, nonzero, recipe)
    saturated = nonzero & (q.scaled.abs() > element.max_finite * (1 + 2.0**-20))
    amax = float(original.abs().max()) if original.numel() else 0.0
    recipe_scales = q.scale[torch.isfinite(q.scale) & (q.scale > 0)]
    # blocks of BLOCK along the reduction, each with its own scale max/amax (zero blocks have none)
    moved = original.movedim(dim, -1).double()
    rows = moved.reshape(-1, moved.shape[-1]) if moved.dim() else moved.reshape(1, 1)
    pad = (-rows.shape[1]) % BLOCK
    blocks = torch.nn.functional.pad(rows, (0, pad)).reshape(-1, BLOCK)
    block_amax = blocks.abs().amax(dim=1)
    live = block_amax > 0
    moved_flushed = flushed.movedim(dim, -1).reshape(rows.shape)
    block_flushed = torch.nn.functional.pad(moved_flushed, (0, pad)).reshape(-1, BLOCK).sum(dim=1)
    block_nonzero = (blocks != 0).sum(dim=1)
    block_scaled = replace(recipe, granularity="block", block=BLOCK, scale="fp32", power_of_two=False)
    finer = quantise_along(original, replace(block_scaled, stochastic=False), dim)
    finer_flushed = float(_flushed(finer, nonzero, block_scaled).sum())
    return {
        "element": element.name,
        "granularity": recipe.granularity if recipe.granularity != "block" else f"block of {recipe.block}",
        "elements": int(original.numel()),
        "nonzero": count,
        "amax": amax,
        "tensor_scale": element.max_finite / amax if amax > 0 else math.inf,
        "scale": _spread(recipe_scales),
        "underflow_fraction": float(flushed.sum()) / count if count else 0.0,
        "saturated_fraction": int(saturated.sum()) / count if count else 0.0,
        "blocks": {
            "size": BLOCK, "count": int(block_amax.numel()), "zero": int((~live).sum()),
            "scale": _spread(element.max_finite / block_amax[live]),
            "underflow_fraction": _spread(block_flushed[live].double() / block_nonzero[live].double()),
        },
        # what a scale per block of BLOCK (fp32, max/amax) in the same element format would flush
        "block_scaled_underflow_fraction": finer_flushed / count if count else 0.0,
    }


def gradient_totals(layers: Dict[str, Dict[str, dict]]) -> Dict[str, float]:
    """Over every converted layer's output gradient: the fractions of nonzero values flushed and saturated."""
    grads = [stats["grad_output"] for stats in layers.values() if "grad_output" in stats]
    nonzero = sum(g["nonzero"] for g in grads)
    if not nonzero:
        return {"scaled_gradient_underflow_fraction": 0.0, "scaled_gradient_saturated_fraction": 0.0}
    return {"scaled_gradient_underflow_fraction": sum(g["underflow_fraction"] * g["nonzero"] for g in grads) / nonzero,
            "scaled_gradient_saturated_fraction": sum(g["saturated_fraction"] * g["nonzero"] for g in grads) / nonzero}


def delayed_statistics(values: torch.Tensor, recipe, scale: float, read: Optional[torch.Tensor] = None) -> Dict[str, object]:
    """``scale_statistics`` of ``values`` quantised with one given per-tensor ``scale`` (a delayed-scaling
    recipe's, from earlier steps' amax): the flushes of ``read`` (the values the GEMM read; by default
    ``values`` rounded at that scale), the values the scale pushes beyond the element's largest value."""

    original = values.detach()
    scaled = original.float() * scale
    if read is None:
        read = round_element(scaled, recipe.element) / scale
    stats = scale_statistics(original, recipe, read=read)
    nonzero = original != 0
    count = int(nonzero.sum())
    saturated = nonzero & (scaled.abs() > recipe.element.max_finite * (1 + 2.0**-20))
    stats.update(tensor_scale=scale, scale=[scale] * 3, delayed=True,
                 saturated_fraction=int(saturated.sum()) / count if count else 0.0)
    return stats
