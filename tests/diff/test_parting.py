"""Where two runs part (preclint/diff/parting.py): the first divergent node, the contributed and
inherited split along the model, and decisions replayed."""
from __future__ import annotations

import copy

import pytest
import torch

from preclint.diff.parting import Setting, part
from preclint.measure.runners import capture_graph, run_mode
from tests.models.diff_models import Mlp, ToyMoE

LAYERS = ("fc2", "fc3", "fc4")


def _perturbed(seed: int):
    torch.manual_seed(seed)
    a = Mlp().eval()
    b = copy.deepcopy(a)
    layer = LAYERS[seed % len(LAYERS)]
    generator = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        weight = getattr(b, layer).weight
        weight.add_(1e-3 * torch.randn(weight.shape, generator=generator))
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(seed))
    return a, b, layer, (x,)


@pytest.mark.parametrize("seed", range(6))
def test_the_first_divergent_node_is_the_perturbed_layer_for_every_seed(seed):
    a, b, layer, inputs = _perturbed(seed)
    graph = capture_graph(a, inputs)
    parting = part(Setting("A", a, "fp16"), Setting("B", b, "fp16"), inputs, graph, replay_decisions=False)
    assert parting.first is not None and graph[parting.first.name].module_path == layer
    # the perturbed layer contributes all of its difference; every node after it only inherits
    at = [n.name for n in parting.nodes].index(parting.first.name)
    assert parting.nodes[at].contributed == pytest.approx(parting.nodes[at].difference)
    assert parting.nodes[at].inherited == pytest.approx(0.0, abs=1e-12)
    for later in parting.nodes[at + 1:]:
        assert later.contributed == pytest.approx(0.0, abs=1e-12)
        assert later.inherited == pytest.approx(later.difference)


def test_two_precisions_part_at_the_first_layer_and_each_layer_contributes():
    torch.manual_seed(0)
    model = Mlp().eval()
    inputs = (torch.randn(16, 32),)
    graph = capture_graph(model, inputs)
    parting = part(Setting("fp16", model, "fp16"), Setting("bf16", model, "bf16"), inputs, graph)
    assert graph[parting.first.name].module_path == "fc1"
    linears = [n for n in parting.nodes if graph[n.name].kind == "linear"]
    assert all(n.contributed and n.contributed > 2 ** -11 for n in linears)
    assert parting.output_difference > 2 ** -9
    assert parting.replays == []  # no decision in an MLP


def test_a_run_against_itself_does_not_part():
    torch.manual_seed(0)
    model = Mlp().eval()
    inputs = (torch.randn(4, 32),)
    parting = part(Setting("a", model, "bf16"), Setting("b", model, "bf16"), inputs, capture_graph(model, inputs))
    assert parting.first is None and parting.output_difference == 0.0


def _flipped_rows_share(first, second) -> float:
    """The ablation: the part of the squared output difference on the tokens whose expert changed
    (an expert's bias moves its tokens by a unit times the gate, about 1/8: far beyond any rounding)."""
    d = (second.double() - first.double())
    rows = d.abs().amax(-1) > 0.05
    return float((d[rows] ** 2).sum() / (d ** 2).sum())


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3))
def test_forcing_the_routers_choices_explains_what_the_ablation_says(seed):
    torch.manual_seed(seed)
    model = ToyMoE().eval()
    inputs = (torch.randn(2048, 32, generator=torch.Generator().manual_seed(seed)),)
    graph = capture_graph(model, inputs)
    parting = part(Setting("fp16", model, "fp16"), Setting("bf16", model, "bf16"), inputs, graph)
    (replay,) = parting.replays
    assert graph[replay.node].fn == "topk" and replay.flips > 0
    ablation = _flipped_rows_share(run_mode(model, inputs, "fp16", graph=graph), run_mode(model, inputs, "bf16", graph=graph))
    assert 0.5 < ablation
    assert abs(replay.explained - ablation) <= 0.05


def test_a_precision_against_float32_itself():
    torch.manual_seed(0)
    model = Mlp().eval()
    inputs = (torch.randn(16, 32),)
    graph = capture_graph(model, inputs)
    parting = part(Setting("fp16", model, "fp16"), Setting("fp32", model, None), inputs, graph)
    assert graph[parting.first.name].module_path == "fc1"
    # float32 differs from fp16 by fp16's own error: a few units of its rounding, 2^-11
    assert 2 ** -13 < parting.output_difference < 2 ** -6


def test_a_max_pool_module_contributes_nothing_and_is_not_replayed():
    # the largest value of a window is exact in every format (core/exact_ops.py): under fp16 the pool
    # changes nothing itself; a replay on float32 operands would charge it their rounding to float16,
    # which the conv that stores them in float16 owns
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 4 * 4, 4)).eval()
    inputs = (torch.randn(2, 3, 8, 8),)
    graph = capture_graph(model, inputs)
    parting = part(Setting("fp32", model, None), Setting("fp16", model, "fp16"), inputs, graph)
    rows = {graph[n.name].module_path: n for n in parting.nodes}
    assert rows["1"].difference > 2 ** -14  # it receives the conv's rounding
    assert rows["1"].contributed == 0.0 and rows["1"].note is None
    assert rows["0"].contributed > 2 ** -14
