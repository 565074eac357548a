"""A tensor quantised by a scaled-GEMM recipe with its groups (rows, blocks) along any one dimension: the
GEMMs of a training step read the same tensor along different dimensions (an output's gradient along N
for the input's gradient, along M for the weight's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from preclint.core.numerics import Recipe
from preclint.measure.scaled import Quantised


@dataclass
class Along:
    """A tensor quantised in groups along one dimension: the values the GEMM reads (dequantised, float32),
    the scaled values before rounding, and each group's encoding scale (flat)."""

    values: torch.Tensor
    scaled: torch.Tensor
    scale: torch.Tensor


def quantise_along(t: torch.Tensor, recipe: Recipe, dim: int = -1, generator: Optional[torch.Generator] = None) -> Along:
    """``t`` quantised by ``recipe`` with its groups (rows, blocks) running along ``dim`` (the GEMM's
    reduction); a block recipe pads that dimension with zeros to whole blocks (a zero adds nothing to amax)."""
    moved = t.detach().float().movedim(dim, -1)
    shape = moved.shape
    rows = moved.reshape(-1, shape[-1]) if moved.dim() else moved.reshape(1, 1)
    width = rows.shape[1]
    pad = (-width) % recipe.block if recipe.granularity == "block" else 0
    if pad:
        rows = F.pad(rows, (0, pad))
    q = Quantised(rows, recipe, generator)

    def back(values: torch.Tensor) -> torch.Tensor:
        return values.reshape(rows.shape)[:, :width].reshape(shape).movedim(-1, dim)

    return Along(back(q.values), back(q.scaled), q.scale.reshape(-1))
