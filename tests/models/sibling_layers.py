"""A helper module imported by blocks_and_net.py as a sibling (tests sys.path handling)."""

import torch
from torch import nn


class Scale(nn.Module):
    """Defined here, so it is never a candidate model of the files that import it."""

    def __init__(self, factor: float = 2.0):
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor
