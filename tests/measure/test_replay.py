"""Replaying an eager recording (preclint/measure/replay.py through Program.run): bit for bit the
model's own run where it replays, and the model's own run where a replay could not be sound."""
import pytest
import torch
from torch import nn

from preclint.capture.observer import Observer
from preclint.core.ir import Graph
from preclint.measure.program import Program, RunFailed


class Values(Observer):
    """Keeps every node's output; optionally rounds float outputs to bfloat16 and back (as a mode's
    sweep hands rounded values on)."""

    def __init__(self, rounding: bool = False) -> None:
        self.values = {}
        self.rounding = rounding

    def __call__(self, node, args, kwargs, callee, output):
        if self.rounding and isinstance(output, torch.Tensor) and output.is_floating_point():
            output = output.to(torch.bfloat16).to(output.dtype)
        if isinstance(output, torch.Tensor):
            self.values[node.name] = output.detach().clone()
        return output


def eager_program(model) -> Program:
    return Program(Graph([], "model", "function-mode"), model)


def runs(model, inputs, count, observer=Observer, grad=False):
    """``count`` runs through one Program: (the program, each run's observer and output)."""
    program = eager_program(model)
    results = []
    with torch.set_grad_enabled(grad):
        for _ in range(count):
            obs = observer()
            results.append((obs, program.run(model, inputs, obs)))
    return program, results


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                         bos_token_id=0, eos_token_id=0, attn_implementation="sdpa", use_cache=False)
    return LlamaForCausalLM(config).eval(), (torch.randint(0, 128, (1, 12)),)


class Branching(nn.Module):
    """Python control flow on a value: FX cannot trace it; another input takes the other branch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        if y.sum() > 0:
            return y * 2
        return y * 3


class Counting(nn.Module):
    """Reads Python state of its own: each run adds another constant."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.lin(x) + self.calls


class Noisy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + 0.01 * torch.randn_like(x)


class WritesInput(nn.Module):
    def forward(self, x):
        x.mul_(2)
        return x + 1


class DtypeBranch(nn.Module):
    """Branches on a dtype: an observer that hands on float64 makes the model take the other branch."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        y = self.lin(x)
        scale = 2.0 if y.dtype == torch.float32 else 3.0
        return torch.relu(y) * scale


class Widening(Observer):
    def __init__(self, resettable: bool) -> None:
        self.resettable = resettable

    def __call__(self, node, args, kwargs, callee, output):
        return output.double() if node.fn == "linear" else output

    def reset(self) -> bool:
        return self.resettable


class Tied(nn.Module):
    """Module calls, views, an in-place op on an intermediate, a no_grad region and a tuple output."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)
        self.scale = nn.Parameter(torch.rand(6))
        self.register_buffer("offset", torch.linspace(0, 1, 6))

    def forward(self, x):
        h = self.lin(x)
        h = h.view(-1, 2, 3).transpose(1, 2).reshape(x.shape[0], -1)
        h.add_(self.offset)
        with torch.no_grad():
            g = h.abs().max(dim=-1, keepdim=True).values
        h[:, 0] = 0.5
        return self.norm(h * self.scale) / (g + 1), h.sum()


@pytest.mark.slow
def test_a_hugging_face_llama_is_replayed_bit_for_bit_with_the_same_node_names():
    # (transformers' Llama: torch.fx cannot trace it, so the probe records it eagerly)
    model, inputs = tiny_llama()
    program, results = runs(model, inputs, 4, lambda: Values(rounding=True))
    assert program.replayed == 2, program.note  # the first two runs record (and confirm), the others replay
    (first, out1), (_, out2), (third, out3), (fourth, out4) = results
    assert type(out3) is type(out1)  # the model's output structure (a ModelOutput), rebuilt
    assert torch.equal(out1.logits, out3.logits) and torch.equal(out1.logits, out4.logits)
    assert list(third.values) == list(first.values)
    assert all(torch.equal(first.values[name], third.values[name]) for name in first.values)
    assert [n.name for n in program.recorded][-1] == "output"


def test_replay_keeps_in_place_ops_views_no_grad_regions_and_autograd():
    model, inputs = Tied(), (torch.randn(3, 6),)
    eager = eager_program(model)
    eager.replays = False
    program = eager_program(model)
    grads = []
    for p in (eager, program):
        for _ in range(3):
            model.zero_grad()
            out, total = p.run(model, inputs, Observer())
            (out.sum() + total).backward()
            grads.append((out.detach(), total.detach(), model.lin.weight.grad.clone(), model.scale.grad.clone()))
    assert program.replayed == 1 and eager.replayed == 0
    for got in grads[1:]:
        assert all(torch.equal(a, b) for a, b in zip(grads[0], got))


def test_a_float64_recording_is_not_replayed_on_a_float32_copy():
    model, inputs = Tied(), (torch.randn(3, 6),)
    program = eager_program(model)
    model64 = Tied().double()
    model64.load_state_dict(model.state_dict())
    with torch.no_grad():
        program.run(model64, (inputs[0].double(),), Observer())
        program.run(model64, (inputs[0].double(),), Observer())
        out = program.run(model, inputs, Observer())[0]
    assert program.replayed == 0 and out.dtype == torch.float32


def test_data_dependent_control_flow_is_not_replayed_wrong():
    model = Branching()
    positive, negative = torch.ones(2, 4), -torch.ones(2, 4)
    with torch.no_grad():
        model.lin.weight.copy_(torch.eye(4))
        model.lin.bias.zero_()
    program = eager_program(model)
    with torch.no_grad():
        program.run(model, (positive,), Observer())
        program.run(model, (positive,), Observer())
        out = program.run(model, (negative,), Observer())
    assert torch.equal(out, negative * 3)  # the branch the model takes on this input
    assert program.replayed == 0 and "values in Python" in program.note


@pytest.mark.parametrize("model, reason", [
    (Counting(), "other constants"), (Noisy(), "random numbers"), (WritesInput(), "in place")],
    ids=["python-state", "random", "writes-input"])
def test_what_a_replay_cannot_repeat_runs_the_model(model, reason):
    x = torch.randn(2, 4)
    program = eager_program(model)
    with torch.no_grad():
        outs = [program.run(model, (x.clone(),), Observer()) for _ in range(3)]
    assert program.replayed == 0
    assert reason in program.note
    if isinstance(model, Counting):
        with torch.no_grad():
            assert torch.equal(outs[2], model.lin(x) + 3)  # the model's own third run


def test_a_replay_stops_where_a_dtype_the_model_reads_differs():
    model, x = DtypeBranch(), torch.randn(2, 4)
    expected = torch.relu(model.lin(x).double()) * 3.0
    for resettable in (True, False):
        program = eager_program(model)
        with torch.no_grad():
            program.run(model, (x,), Observer())
            program.run(model, (x,), Observer())
            if resettable:  # the observer can start over: the model runs instead
                out = program.run(model, (x,), Widening(True))
                assert torch.equal(out, expected)
                assert "diverged" in program.note
            else:  # never a wrong value: the run fails
                with pytest.raises(RunFailed):
                    program.run(model, (x,), Widening(False))


@pytest.mark.slow
def test_the_probe_of_a_llama_measures_the_same_replayed_as_run(monkeypatch):
    from preclint.measure.replay import Recording
    from preclint.probe import ProbeOptions, measure_model
    from tests.helpers import check

    modes = ("tf32", "fp16", "bf16")
    model, inputs = tiny_llama()
    replayed = []
    run = Recording.run
    monkeypatch.setattr(Recording, "run", lambda self, *a: replayed.append(1) or run(self, *a))
    ledgers = []
    for replays in (False, True):
        monkeypatch.setattr(Program, "replays", replays)
        _, graph, _ = check(model, inputs, precisions=modes)
        result = measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu", ledger=True))
        ledgers.append({mode: {name: (m.local and m.local.rel_error, m.received and m.received.rel_error,
                                      m.contribution) for name, m in measure.nodes.items()}
                        for mode, measure in result.modes.items()})
        if not replays:
            assert not replayed
    # the float32 passes after the first (tf32's sweep among them); the float16 and bfloat16 sweeps
    # store their results in their format and record for themselves
    assert len(replayed) >= 2
    assert ledgers[0] == ledgers[1] and ledgers[0]["fp16"]


class Chain(nn.Module):
    def forward(self, x):
        for _ in range(8):
            x = torch.tanh(x) * 1.5
        return x


class Alive(Observer):
    """How many earlier results are still alive when each op has run (weak references only)."""

    def __init__(self) -> None:
        self.made = []
        self.most_alive = 0

    def __call__(self, node, args, kwargs, callee, output):
        import weakref

        self.most_alive = max(self.most_alive, sum(r() is not None for r in self.made))
        if isinstance(output, torch.Tensor) and node.fn != "input":
            self.made.append(weakref.ref(output))
        return output


def test_a_replay_lets_each_value_go_after_its_last_use():
    model, x = Chain(), torch.randn(64, 64)
    program, results = runs(model, (x,), 3, Alive)
    assert program.replayed == 1
    recorded, replayed = results[0][0], results[2][0]
    assert recorded.most_alive == 15  # the recorder keeps every value of the run it records
    assert replayed.most_alive <= 2


def test_a_model_with_hooks_of_its_own_runs_them_every_pass():
    model = Tied()
    calls = []
    model.register_forward_hook(lambda module, args, output: calls.append(1))
    program = eager_program(model)
    with torch.no_grad():
        for _ in range(3):
            program.run(model, (torch.randn(3, 6),), Observer())
    assert program.replayed == 0 and len(calls) == 3 and "hooks" in program.note


class KeepsFloat32(nn.Module):
    """A region the model turns autocast off in, as transformers' rotary embeddings do."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        with torch.autocast("cpu", enabled=False):
            angles = x.float() @ x.float().T
        return self.lin(x) + angles.sum()


def test_a_region_with_autocast_turned_off_is_replayed():
    """The regions nest through `outer`: a replay of a model that turns autocast off once crashed the
    probe of every transformers Llama on a GPU (AttributeError in the reference pass)."""
    model, inputs = KeepsFloat32(), (torch.randn(3, 4),)
    program, results = runs(model, inputs, 3, Values)
    assert program.replayed == 1, program.note
    assert torch.equal(results[0][1], results[2][1])


def test_a_failure_of_the_recording_itself_runs_the_model(monkeypatch):
    """Whatever the tape's bookkeeping does not foresee costs the replay, not the probe's run."""
    from preclint.measure import replay

    def broken(self, *args):
        raise AttributeError("a case the tape did not foresee")

    monkeypatch.setattr(replay.Tape, "op", replay._refuses_on_error(broken))
    model, inputs = Tied(), (torch.randn(3, 6),)
    program, results = runs(model, inputs, 3, Values)
    assert program.replayed == 0 and "the recording failed (AttributeError" in program.note
    assert torch.equal(results[0][1][0], results[2][1][0])
