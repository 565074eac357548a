"""Tiny models that show what torch.compile (Inductor) does to a model's numbers (tests/probe/test_compiled.py).

* ``PointwiseChain``: a chain of pointwise ops after a linear layer; eager rounds each result to
  bfloat16 under autocast, Inductor fuses the chain and keeps it in float32;
* ``FusedNorm``: an RMS norm written out in pointwise ops and a mean, which Inductor fuses;
* ``KeptRegion``: an attention-like softmax the code keeps in float32 (autocast off, ``.float()``);
* ``DeliberateRounding``: the code rounds a value to bfloat16 on purpose, which a fused kernel drops;
* ``Blocks``: three blocks, only the middle one with a pointwise chain.
"""
import torch
from torch import nn


class PointwiseChain(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.b = nn.Linear(width, width)

    def forward(self, x):
        y = self.a(x)
        z = torch.tanh(y * 1.7 + 0.3) * y
        z = z * z + y
        z = z / (1 + z.abs())
        return self.b(z)


class RMSNorm(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x):
        return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * self.weight


class FusedNorm(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)
        self.norm = RMSNorm(width)
        self.b = nn.Linear(width, width)

    def forward(self, x):
        return self.b(self.norm(self.a(x) * 4.0))


class KeptRegion(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.out = nn.Linear(width, width)

    def forward(self, x):
        scores = self.q(x) * 8.0
        with torch.autocast(x.device.type, enabled=False):
            weights = torch.softmax(scores.float() * 2.0, dim=-1)
        return self.out(weights)


class DeliberateRounding(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.a = nn.Linear(width, width)

    def forward(self, x):
        y = self.a(x).float() * 0.5
        stored = y.to(torch.bfloat16).float()  # the value as a bfloat16 cache would hold it
        return stored * 3.0 + y


class Plain(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Chain(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.lin = nn.Linear(width, width)

    def forward(self, x):
        y = self.lin(x)
        z = torch.tanh(y * 1.7 + 0.3) * y
        return z / (1 + z.abs()) + y


class Blocks(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Plain(width), Chain(width), Plain(width)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _built(cls):
    torch.manual_seed(0)
    return cls().eval(), (torch.randn(32, 64),)


def pointwise_chain():
    return _built(PointwiseChain)


def fused_norm():
    return _built(FusedNorm)


def kept_region():
    return _built(KeptRegion)


def deliberate_rounding():
    return _built(DeliberateRounding)


def blocks():
    return _built(Blocks)


model = PointwiseChain
example_inputs = (torch.randn(32, 64),)
