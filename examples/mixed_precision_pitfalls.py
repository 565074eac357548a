"""An example model for preclint: a small image classifier with two classic precision pitfalls.

    preclint check examples/mixed_precision_pitfalls.py
    preclint check examples/mixed_precision_pitfalls.py --precision fp16-full,bf16 --rtol 1e-3 --atol 1e-3

1. It takes raw 0-255 pixels and its residual stages have no normalization, so activations grow
   stage by stage past float16's 65504 (PCL101 under autocast float16; bfloat16 has the range).
2. It uses depthwise convolutions, whose kernel and accumulator depend on the backend that runs
   the whole model in float16 (PCL205 under fp16-full, as exported engines run it).
"""
import torch
from torch import nn


class ResidualStage(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.depthwise = nn.Conv2d(channels, channels, 3, padding=1, groups=channels)
        self.act = nn.ReLU()

    def forward(self, x):
        # no normalization: each stage multiplies the scale of the residual stream
        return x + 8.0 * self.depthwise(self.act(self.conv1(x)))


class PitfallNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 32, 3, stride=2, padding=1)
        self.stages = nn.Sequential(*[ResidualStage(32) for _ in range(10)])
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(32, num_classes)

    def forward(self, x):
        features = self.pool(self.stages(self.stem(x))).flatten(1)
        return self.head(features)


def example_inputs():
    torch.manual_seed(0)
    return (torch.randint(0, 256, (8, 3, 64, 64)).float(),)  # raw pixels, not normalized
