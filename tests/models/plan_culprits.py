"""Models whose float16 culprit is known, for `preclint plan`.

* ``WideLayer``: ``big`` (weights x 3e5) produces values around 1e5, beyond float16's 65504.
* ``RMSHead``: activations around 2000 whose squares overflow float16 inside the norm (``h * h``):
  one op, not a module, is the culprit.
* ``Healthy``: a small conv net well inside float16's range: the right plan keeps nothing.
* ``OffsetClassifier``: class scores around 1000 whose top-1 float16 rounding flips (``head``).
* ``TinyVariance``: a frozen norm's variance of 1e-9, which float16 flushes to 0 before an rsqrt.
* ``OffsetInputs``: inputs whose signal float16 cannot hold.
* ``InlineFrozenNorm``: a frozen batch norm written into a block's own forward, on buffers, between
  the block's two convs: the culprit is the rounded buffer inside a module that is mostly FLOPs.
* ``CachedScale``: WideLayer with a scale it computed from its weights and keeps with its autograd
  history (as weight_norm leaves a weight): copy.deepcopy refuses to copy it.
"""

import torch
from torch import nn


class WideLayer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(64, 64)
        self.big = nn.Linear(64, 64)
        with torch.no_grad():
            self.big.weight.mul_(300000.0)
        self.norm = nn.LayerNorm(64)
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = self.big(h)
        return self.head(self.norm(h))


class CachedScale(WideLayer):
    def __init__(self):
        super().__init__()
        self.scale = self.head.weight.sum(0) * 0 + 1  # ones, with autograd history

    def forward(self, x):
        return super().forward(x * self.scale.detach()[:1])


class RMSHead(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(32, 64)
        with torch.no_grad():
            self.fc.weight.mul_(1000.0)
        self.head = nn.Linear(64, 8)

    def forward(self, x):
        h = self.fc(x)
        var = (h * h).mean(-1, keepdim=True)
        return self.head(h * torch.rsqrt(var + 1e-6))


class Healthy(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.bn(self.conv1(x)))
        h = torch.relu(self.conv2(h)).mean((2, 3))
        return self.head(h)


class OffsetClassifier(nn.Module):
    """Class scores around 1000 that differ by tenths: float16 rounds them in steps of 0.5, so the
    head's rounding flips the top class; the features before it are harmless."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.features = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)
        with torch.no_grad():
            self.head.bias.fill_(1000.0)

    def forward(self, x):
        return self.head(self.features(x))


class TinyVariance(nn.Module):
    """A frozen norm whose running variance holds 1e-9 for four dead channels: float16 flushes it to
    0 and rsqrt makes inf of it. The culprit is the buffer, not a layer: keeping ``var`` alone in
    float32 (0 FLOPs) is the plan."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 16)
        with torch.no_grad():
            self.fc.weight.mul_(0.1)
        var = torch.ones(16)
        var[:4] = 1e-9
        self.var = nn.Parameter(var, requires_grad=False)  # frozen (InlineFrozenNorm holds buffers)
        self.head = nn.Linear(16, 4)
        with torch.no_grad():
            self.head.weight.mul_(1e-3)

    def forward(self, x):
        return self.head(self.fc(x) * self.var.rsqrt())


class OffsetInputs(nn.Module):
    """Inputs around 1000 whose variations of 0.01 carry the signal, centred inside the model:
    float16 holds 1000 only to 0.5, so casting the inputs is the culprit and no layer kept in
    float32 undoes it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = nn.Linear(16, 8)

    def forward(self, x):
        return self.fc((x - 1000.0) * 100.0)


class _FrozenNormBlock(nn.Module):
    """conv, a frozen batch norm on the block's own buffers (eps 0, as torchvision's old
    FrozenBatchNorm2d) with four collapsed channels, relu, conv."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(8, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.register_buffer("weight", torch.ones(16))
        self.register_buffer("bias", torch.zeros(16))
        self.register_buffer("running_mean", torch.zeros(16))
        var = torch.ones(16)
        var[:4] = 1e-9  # what a checkpoint holds for channels whose batch variance collapsed
        self.register_buffer("running_var", var)
        self.eps = 0.0

    def forward(self, x):
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        h = self.conv1(x) * 1e-4 * scale[None, :, None, None] + shift[None, :, None, None]
        return self.conv2(torch.relu(h))


class InlineFrozenNorm(nn.Module):
    """A stem conv, then ``block``: float16 flushes ``block.running_var``'s 1e-9 to 0 and the rsqrt
    makes the scale inf. Keeping that buffer alone in float32 (0 FLOPs) is the plan, not ``block``
    (most of the model's FLOPs)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.block = _FrozenNormBlock()
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.block(torch.relu(self.stem(x))).mean((2, 3)))
