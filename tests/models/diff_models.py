"""Small models `preclint diff` is tested on: a ResNet-ish CNN with batch norms (checkpoints that
differ in their statistics), a plain MLP (one layer perturbed) and a toy mixture of experts whose
router's top-1 choices flip between precisions."""
import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    def __init__(self, width: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(width)
        self.layer1 = Block(width)
        self.layer2 = Block(width)
        self.layer3 = Block(width)
        self.fc = nn.Linear(width, classes)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(x.mean((2, 3)))


class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 64)
        self.fc3 = nn.Linear(64, 64)
        self.fc4 = nn.Linear(64, 10)

    def forward(self, x):
        x = torch.tanh(self.fc1(x))
        x = torch.tanh(self.fc2(x))
        x = torch.tanh(self.fc3(x))
        return self.fc4(x)


class ToyMoE(nn.Module):
    """Top-1 routing over experts whose outputs differ widely: a token whose route flips moves far."""

    def __init__(self, dim: int = 32, experts: int = 8) -> None:
        super().__init__()
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(dim, dim) for _ in range(experts))
        with torch.no_grad():
            self.router.weight.mul_(0.05)  # logits close together: small margins, routes that flip
            for k, expert in enumerate(self.experts):
                expert.bias.fill_(float(k))  # experts far apart

    def forward(self, x):
        logits = self.router(x)
        gate, choice = torch.topk(torch.softmax(logits, -1), 1, dim=-1)
        every = torch.stack([expert(x) for expert in self.experts], 1)  # tokens, experts, dim
        chosen = every.gather(1, choice.unsqueeze(-1).expand(-1, -1, every.shape[-1])).squeeze(1)
        return chosen * gate


def resnet():
    torch.manual_seed(0)
    return SmallResNet()


def example_inputs():
    return (torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)),)
