"""The reference pass's analyses on the model's own device. Their random directions are drawn on the
CPU (the same on every device); one left there for a value on a GPU made the analysis fail, and its
failure is quiet by design (the node keeps its boundary roundings), so every GPU check lost the inner
roundings of its LSTMs and attention modules: predictions 6-12x under the GPU's measurement on a trained
LSTM and a DiT block, while the same checks on the CPU were right."""
import ast

import pytest
import torch
from torch import nn

from preclint.reference.analyses.attention import AttentionRoundings
from preclint.reference.analyses.recurrence import Recurrence
from tests.helpers import check
from tests.paths import ROOT

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU")])]


class RecurrentAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.attention = nn.MultiheadAttention(32, 4, batch_first=True)
        self.head = nn.Linear(32, 8)

    def forward(self, x):
        h, _ = self.lstm(x)
        a, _ = self.attention(h, h, h, need_weights=False)
        return self.head(a)


@pytest.mark.parametrize("device", DEVICES)
def test_the_inner_roundings_are_weighed_on_the_models_device(device):
    torch.manual_seed(0)
    model = RecurrentAttention().eval().to(device)
    _report, graph, _ctx = check(model, (torch.randn(2, 12, 16, device=device),), precisions=("fp16",))
    recurrences = [n.record(Recurrence) for n in graph.nodes if n.record(Recurrence) is not None]
    attentions = [n.record(AttentionRoundings) for n in graph.nodes if n.record(AttentionRoundings) is not None]
    assert len(recurrences) == 1 and recurrences[0].to_output is not None and sum(recurrences[0].to_output) > 0
    assert len(attentions) == 1 and attentions[0].operands.get(0, 0.0) > 0


def test_random_directions_in_the_reference_pass_follow_their_values_device():
    """A draw from a CPU generator lands on the CPU: in preclint/reference/ each one is moved to its
    value's device (direction_like, or `.to(...)` on the draw itself)."""
    draws = ("randn", "rand", "randint", "randn_like", "rand_like")
    stray = []
    for path in sorted((ROOT / "preclint" / "reference").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        moved = {id(n.func.value) for n in ast.walk(tree) if isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Attribute) and n.func.attr == "to"}
        for n in ast.walk(tree):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in draws
                    and not any(k.arg == "device" for k in n.keywords) and id(n) not in moved):
                stray.append(f"{path.relative_to(ROOT)}:{n.lineno}")
    assert not stray, stray
