"""Work a sweep does not do twice (probe/sweep.py, measure/modes.py): a replay that would repeat the
run's own call (every float operand is the reference's value already), a mode's replay that would
compute what the exact one does (operands only widened, the float32 model's parameters), a weight
already exact in the format (shared, not copied). Each gives the figures the full work gives."""
import pytest
import torch
from torch import nn

from preclint.measure.runners import runner_for
from preclint.probe import ProbeOptions, measure_model
from preclint.measure import sweep as walk_module
from preclint.probe import sweep as sweep_module

MODES = ("tf32", "fp16", "bf16", "fp16-full")


def cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1),
                         nn.BatchNorm2d(8), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)).eval()


def in_bfloat16(model):
    """The model with every float32 weight rounded to bfloat16 (as a checkpoint stored in it)."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16).float())
    return model


def figures(result):
    return {mode: {name: (m.local.rel_error if m.local else None, m.received.rel_error if m.received else None,
                          m.contribution) for name, m in measure.nodes.items()}
            for mode, measure in result.modes.items()}


def probe(model):
    torch.manual_seed(1)
    inputs = (torch.rand(2, 3, 12, 12),)
    return measure_model(model, inputs, None, MODES, ProbeOptions(device="cpu"))


@pytest.mark.slow
@pytest.mark.parametrize("build", [cnn, lambda: in_bfloat16(cnn())], ids=["float32 weights", "bfloat16 weights"])
def test_the_shortcuts_give_the_figures_of_the_full_work(monkeypatch, build):
    calls = {"n": 0}
    invoke = sweep_module.invoke

    def counted(*args, **kwargs):
        calls["n"] += 1
        return invoke(*args, **kwargs)

    # the exact replays call from the probe's sweep, the mode's replays from the walk it builds on
    monkeypatch.setattr(sweep_module, "invoke", counted)
    monkeypatch.setattr(walk_module, "invoke", counted)
    short = probe(build())
    short_calls = calls["n"]
    monkeypatch.setattr(sweep_module, "_same_arithmetic", lambda a, b: False)
    monkeypatch.setattr(sweep_module.SweepObserver, "_operands_as_in_reference", lambda self, a, k: False)
    calls["n"] = 0
    full = probe(build())
    assert figures(short) == figures(full)
    assert short_calls < calls["n"]  # (the first conv's replay, the batch norms' exact replays at least)
    for measure in short.modes.values():
        assert measure.error is None
        assert all(m.local is not None for name, m in measure.nodes.items() if "conv" in name or "linear" in name)


def test_a_weight_exact_in_the_format_is_shared_and_another_is_copied():
    model = cnn()
    with torch.no_grad():
        model[0].weight.copy_(model[0].weight.to(torch.bfloat16).float())
    run = runner_for("bf16", "cpu", emulated=True).prepare(model, (torch.rand(1, 3, 8, 8),))
    assert run.variant[0].weight is model[0].weight
    assert run.variant[3].weight is not model[3].weight
    assert torch.equal(run.variant[3].weight, model[3].weight.to(torch.bfloat16).float())
