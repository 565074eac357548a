"""Two zero-argument classes; Net builds Blocks, so Net is the model."""

import torch
from torch import nn

from sibling_layers import Scale  # a sibling import: the loader must put this directory on sys.path


class Block(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.scale = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.scale(self.linear(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(Block(), Block())
        self.dropout = nn.Dropout(0.5)  # makes eval() mode observable
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.dropout(self.blocks(x)))


example_inputs = (torch.rand(2, 8),)
