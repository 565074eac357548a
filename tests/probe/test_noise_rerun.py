"""The noise floor's second float64 run is skipped where its answer is known (probe/noise.py,
replays_alike): a traced graph of tensor ops that draws nothing, on the CPU; a model that draws, runs
Python of its own between its ops, or (on a GPU) sums with atomics is run twice as before."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from preclint.core.notes import texts
from preclint.capture.fx_capture import capture_fx
from preclint.core.ir import Graph
from preclint.measure.program import Program
from preclint.probe import ProbeOptions, measure_model
from preclint.probe import noise
from preclint.probe.noise import generator_states, replays_alike

CPU = torch.device("cpu")
CUDA = torch.device("cuda")  # only named: replays_alike reads the graph, it runs nothing there


def program_of(model, inputs):
    traced: list = []
    nodes, _ = capture_fx(model, inputs, None, traced)
    return Program(Graph(nodes, "m", "fx", ran_reference=True, fx_graph=traced[0]), model)


class Scatter(nn.Module):
    def forward(self, x):
        return torch.zeros(4, 8).scatter_add(0, torch.zeros_like(x, dtype=torch.long), x)


@torch.fx.wrap
def _python_of_its_own(x):
    return x * 2


class Wrapped(nn.Module):
    def forward(self, x):
        return _python_of_its_own(x)


class Noisy(nn.Module):
    def forward(self, x):
        return x + torch.randn_like(x)


class Reruns:
    """How many second float64 runs the probe made (noise.rerun's WideningObserver, counted)."""

    def __init__(self):
        self.count = 0

    def __eq__(self, other):
        return self.count == other


@pytest.fixture
def reruns(monkeypatch):
    counter = Reruns()

    class Counted(noise.WideningObserver):
        def __init__(self):
            counter.count += 1
            super().__init__()

    monkeypatch.setattr(noise, "WideningObserver", Counted)
    return counter


def test_a_plain_traced_model_on_the_cpu_replays_alike():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()
    program = program_of(model, (torch.rand(4, 8),))
    assert replays_alike(program, model, CPU, generator_states(CPU))


@pytest.mark.parametrize("model", [nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).train(), Noisy(), Wrapped()],
                         ids=["dropout in training", "randn_like", "a wrapped function"])
def test_a_model_that_may_give_another_output_is_run_again(model):
    program = program_of(model, (torch.rand(4, 8),))
    assert not replays_alike(program, model, CPU, generator_states(CPU))


def test_a_draw_seen_only_in_the_generator_is_run_again():
    model = nn.Sequential(nn.Linear(8, 8)).eval()
    program = program_of(model, (torch.rand(4, 8),))
    before = generator_states(CPU)
    torch.rand(1)  # what a draw the graph does not name (inside a leaf module) leaves behind
    assert not replays_alike(program, model, CPU, before)


def test_atomic_sums_are_run_again_on_a_gpu_only():
    model = Scatter()
    program = program_of(model, (torch.rand(4, 8),))
    assert replays_alike(program, model, CPU, generator_states(CPU))
    assert not replays_alike(program, model, CUDA, generator_states(CUDA))


@pytest.mark.slow
def test_the_probe_of_a_deterministic_traced_model_runs_its_reference_once(reruns):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.GELU(), nn.Linear(16, 4)).eval()
    result = measure_model(model, (torch.rand(8, 16),), None, ("bf16",), ProbeOptions(device="cpu"))
    assert reruns == 0
    assert result.noise_floor is None and result.modes["bf16"].error is None
    assert not any("deterministic" in note for note in texts(result.notes))


@pytest.mark.slow
def test_the_probe_of_a_noisy_traced_model_still_runs_it_twice(reruns):
    class Drawing(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 4)

        def forward(self, x):
            return self.fc(F.dropout(x, 0.2, training=True))

    result = measure_model(Drawing().eval(), (torch.rand(8, 16),), None, ("bf16",), ProbeOptions(device="cpu"))
    assert reruns == 1 and result.noise_floor is not None
