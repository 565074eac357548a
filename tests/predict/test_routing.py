"""A mixture of experts' router top-k is a decision whose flips the report always states."""
import torch
from torch import nn

from preclint.core.notes import texts
from tests.helpers import check


class SparseMoE(nn.Module):
    """Mixtral's block, small: softmax over the router's logits, top-2 of 8 experts per token."""

    def __init__(self, width=32, experts=8):
        super().__init__()
        self.gate = nn.Linear(width, experts, bias=False)
        self.experts = nn.ModuleList(nn.Linear(width, width) for _ in range(experts))

    def forward(self, x):
        weights = torch.softmax(self.gate(x), dim=-1, dtype=torch.float)
        weights, chosen = torch.topk(weights, 2, dim=-1)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            share = (weights * (chosen == e)).sum(dim=-1, keepdim=True)
            out = out + share * expert(x)
        return out


class TopFive(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(32, 100)

    def forward(self, x):
        return torch.topk(self.head(x), 5, dim=-1).indices


def test_the_router_of_a_mixture_of_experts_gets_its_flip_rate():
    torch.manual_seed(0)
    report, _, _ = check(SparseMoE().eval(), (torch.randn(64, 32),), precisions=("bf16",))
    note = next((n for n in texts(report.notes) if n.startswith("mixture of experts")), None)
    assert note is not None, texts(report.notes)
    assert "1 router (top-2 of 8 experts)" in note and "another expert" in note and "under bf16" in note


def test_a_classifiers_top_five_is_not_a_router():
    torch.manual_seed(0)
    report, _, _ = check(TopFive().eval(), (torch.randn(4, 32),), precisions=("bf16",))
    assert not any(n.startswith("mixture of experts") for n in texts(report.notes))
