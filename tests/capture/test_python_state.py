"""A forward that changes its own plain attributes (a call counter, a step) gives another output on each
call, while torch.fx bakes one call's values into the graph as constants: the report says so."""
import torch
from torch import nn

from preclint.core.notes import texts
from preclint.capture.graph import capture


class Counts(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.fc(x) * (1 + 0.01 * self.calls)


def test_a_forward_that_counts_its_calls_is_said_not_deterministic():
    graph, _ = capture(Counts(), (torch.randn(2, 4),), "Counts")
    assert graph.capture == "fx"
    (note,) = [n for n in texts(graph.notes) if "changes its own attributes" in n]
    assert "calls: 0 -> 1" in note and "not deterministic" in note


def test_a_forward_that_changes_nothing_gets_no_such_note():
    graph, _ = capture(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), (torch.randn(2, 4),), "Plain")
    assert not [n for n in texts(graph.notes) if "changes its own attributes" in n]
