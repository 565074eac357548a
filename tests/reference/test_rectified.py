"""An in-place ReLU's input keeps no copy of its values for the backward passes (statistics_pass
``_rectify``): the gains are those of the same model with an out-of-place ReLU, to the bit, and a value
another op read before the ReLU wrote it is still copied."""
import torch
from torch import nn

from preclint.engine import CheckOptions, build_graph
from preclint.load.loader import LoadedModel
from preclint.reference.analyses.gains import Gains
from preclint.reference import statistics_pass


class _Block(nn.Module):
    """conv, a scale and shift, ReLU; with ``read_before`` the pre-ReLU value also feeds the output."""

    def __init__(self, inplace: bool, read_before: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Conv2d(8, 4, 3)
        self.relu = nn.ReLU(inplace=inplace)
        self.read_before = read_before

    def forward(self, x):
        z = self.conv(x) * 1.5
        z += 0.25  # written in place before the ReLU too, as a residual sum is (out += identity)
        side = z.mean() if self.read_before else 0.0  # read before the ReLU writes z
        return self.head(self.relu(z)) + side


def _gains(inplace: bool, read_before: bool):
    torch.manual_seed(0)
    model = _Block(inplace, read_before).eval()
    inputs = (torch.randn(2, 3, 12, 12),)
    # (recorded as it runs: torch.fx runs in-place activations out of place)
    options = CheckOptions(modes=("bf16",), capture="function-mode")
    graph = build_graph(LoadedModel(model, inputs, "model", None), options)
    return {n.name: (n.record(Gains).out, n.record(Gains).operands) for n in graph.nodes if n.record(Gains)}


def _counting_copies(monkeypatch):
    """The values the observer copied before a write, counted."""
    copies: list = []
    protect = statistics_pass.ReferenceObserver._protect

    def counted(self, target, rectifies=False):
        before = sum(e.snapshot is not None for entries in self.by_storage.values() for e in entries)
        protect(self, target, rectifies)
        copies.append(sum(e.snapshot is not None for entries in self.by_storage.values() for e in entries) - before)

    monkeypatch.setattr(statistics_pass.ReferenceObserver, "_protect", counted)
    return copies


def test_an_inplace_relu_copies_nothing_and_gains_match_the_out_of_place_twin(monkeypatch):
    copies = _counting_copies(monkeypatch)
    inplace = _gains(True, False)
    assert len(copies) == 2 and copies[1] == 0  # the ReLU wrote z and nothing was copied for it
    outplace = _gains(False, False)
    assert inplace and inplace == outplace  # the same floats, not merely close


def test_a_value_read_before_the_relu_is_still_copied(monkeypatch):
    copies = _counting_copies(monkeypatch)
    inplace = _gains(True, True)
    assert len(copies) == 2 and copies[1] >= 1  # the mean read z before the ReLU: its gradient does not pass it
    assert inplace == _gains(False, True)
