"""What NVIDIA's NVFP4 training recipe adds to a scaled GEMM's operands (Transformer Engine's
NVFP4BlockScaling, torchao's NVFP4 training; "Pretraining Large Language Models with NVFP4", 2025):

- 2D weight scaling: the weight quantised once, in tiles of 16 x 16 that share one E4M3 scale (times the
  fp32 tensor scale), so that the forward (``x W^T``, along K) and the input's gradient (``g W``, along N)
  read the same quantised weight;
- a random Hadamard transform of the weight gradient's operands: ``dW = g^T x`` reads ``H g`` and ``H x``,
  with ``H`` block-diagonal along M (the tokens), blocks of 16: a 16 x 16 Hadamard matrix over 4 times a
  fixed diagonal of random signs. ``H^T H = I``, so the product is unchanged; what changes is what the
  quantisation sees: an outlier token's value spread over its block;
- stochastic rounding of the gradients (``g`` for both backward GEMMs); activations and weights round to
  nearest even (the recipe's ``stochastic`` flag, measure/scaled.py ``round_stochastic``).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from preclint.core.numerics import Recipe
from preclint.measure.scaled import Quantised

HADAMARD_BLOCK = 16
TILE = 16


def _hadamard() -> torch.Tensor:
    """The 16 x 16 random Hadamard matrix: Sylvester's, orthonormal, times a fixed random sign diagonal."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < HADAMARD_BLOCK:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    signs = torch.randint(0, 2, (HADAMARD_BLOCK,), generator=torch.Generator().manual_seed(0x4E5646)) * 2 - 1
    return h / HADAMARD_BLOCK ** 0.5 * signs.to(torch.float64)


HADAMARD = _hadamard()


def rotated(t: torch.Tensor) -> torch.Tensor:
    """``t`` (M x N) with the random Hadamard transform applied along M in blocks of 16 (M padded with
    zero rows to whole blocks), in ``t``'s dtype: ``rotated(g).T @ rotated(x) == g.T @ x``."""
    pad = (-t.shape[0]) % HADAMARD_BLOCK
    padded = F.pad(t, (0, 0, 0, pad)) if pad else t
    blocks = padded.reshape(-1, HADAMARD_BLOCK, padded.shape[1])
    return torch.einsum("ij,bjn->bin", HADAMARD.to(t.dtype).to(t.device), blocks).reshape(padded.shape)


def tiles(w: torch.Tensor) -> torch.Tensor:
    """``w`` (N x K, both multiples of 16) as its 16 x 16 tiles, one a row (tiles x 256)."""
    n, k = w.shape
    return w.reshape(n // TILE, TILE, k // TILE, TILE).permute(0, 2, 1, 3).reshape(-1, TILE * TILE)


def untiles(t: torch.Tensor, shape) -> torch.Tensor:
    n, k = shape
    return t.reshape(n // TILE, k // TILE, TILE, TILE).permute(0, 2, 1, 3).reshape(n, k)


def tile_recipe(recipe: Recipe) -> Recipe:
    """``recipe`` with one scale per 16 x 16 tile (a block of 256 of ``tiles``' rows)."""
    return replace(recipe, block=TILE * TILE)


def quantise_weight_2d(w: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """The weight as both GEMMs read it: quantised per 16 x 16 tile (float32)."""
    return untiles(Quantised(tiles(w.detach().float()), tile_recipe(recipe)).values, w.shape)
