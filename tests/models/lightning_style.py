"""The example inputs live on the model, as PyTorch Lightning's `example_input_array`."""

import torch
from torch import nn


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)
        self.example_input_array = (torch.rand(2, 6), torch.rand(2, 6))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.proj(a) + b
