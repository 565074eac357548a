"""A module-level `model` instance of a class that needs arguments, a factory, and callable inputs."""

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, num_classes: int, width: int = 4):
        super().__init__()
        self.fc = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


def make_small() -> nn.Module:
    return Classifier(num_classes=3)


def make_nothing():
    return "not a module"


model = Classifier(num_classes=5)
other = Classifier(num_classes=7)
not_a_model = 42


def example_inputs():
    return torch.rand(1, 4)
