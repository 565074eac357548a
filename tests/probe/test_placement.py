"""The reference pass on the probe's device: the check's statistics come from the model's copy
there (a GPU in use; the CPU here, through the same code), and the probe measures that copy."""
import pytest
import torch

from preclint.config import Config
from preclint.engine import CheckOptions, check_model
from preclint.reference.analyses.gains import Gains
from preclint.load.loader import LoadedModel
from preclint.probe import ProbeOptions, probe_report
from preclint.probe.device_copy import place
from tests.probe.test_stream import sequential

MODES = ("fp16", "bf16")


def checked(placement):
    model, inputs = sequential()
    loaded = LoadedModel(model, inputs, "model", None)
    options = CheckOptions(modes=MODES, placement=placement(loaded) if placement else None)
    report, graph, ctx = check_model(loaded, Config(precisions=MODES), options)
    return loaded, report, graph, ctx, options.placement


@pytest.mark.slow
def test_statistics_from_the_device_copy_are_the_host_ones():
    _, report, graph, _, _ = checked(None)
    loaded, placed_report, placed_graph, _, placement = checked(
        lambda loaded: place(loaded.module, loaded.inputs, torch.device("cpu"), force=True))
    assert placement.model is not loaded.module
    assert [n.name for n in graph.nodes] == [n.name for n in placed_graph.nodes]
    for a, b in zip(graph.nodes, placed_graph.nodes):
        assert (a.outputs, a.records) == (b.outputs, b.records), a.name
    assert report.summary == placed_report.summary
    assert [f.message for f in report.findings] == [f.message for f in placed_report.findings]


@pytest.mark.slow
def test_the_probe_measures_the_placed_copy_without_another():
    loaded, report, graph, ctx, placement = checked(
        lambda loaded: place(loaded.module, loaded.inputs, torch.device("cpu"), force=True))
    result = probe_report(loaded, report, ctx, Config(precisions=MODES), ProbeOptions(device="cpu"), placement=placement)
    assert result.environment["reference"]["statistics_on"] == "cpu"
    assert all(result.modes[m].output.rel_error > 0 for m in MODES)


@pytest.mark.slow
def test_the_backward_passes_leave_the_models_gradients_as_they_were():
    # weight gradients are dropped as they are made (never all at once: a large model's worth of
    # memory on the device); a .grad the user's model holds is kept
    model, inputs = sequential()
    first = next(model.parameters())
    first.grad = torch.full_like(first, 7.0)
    loaded = LoadedModel(model, inputs, "model", None)
    _, graph, _ = check_model(loaded, Config(precisions=MODES), CheckOptions(modes=MODES))
    assert torch.equal(first.grad, torch.full_like(first, 7.0))
    assert all(p.grad is None for p in list(model.parameters())[1:])
    assert any(n.record(Gains) is not None and n.record(Gains).operands for n in graph.nodes)
