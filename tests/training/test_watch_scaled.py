"""preclint.watch under a scaled recipe: the NVFP4 block-scale figures it records are the recipe's (the same
as --train's statistics of the same tensors), and under delayed scaling the stale scale's saturation shows up
at the step whose activations jump, not before, with the jump listed even where that step is not sampled."""
import pytest
import torch

import preclint
from preclint.core.numerics import scaled_recipes
from preclint.measure.scale_statistics import scale_statistics
from preclint.measure.scaled_training import GRADIENT_ELEMENTS, convert_for_training, recipes, weight_statistics
from preclint.report.watch_html import render
from preclint.training import watch_scaled
from preclint.training.watch_record import LayerCounts
from preclint.training.watch_reduce import merge_records

JUMP = 5  # the step from which the inputs are 1000 times larger


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 16))
    x = torch.randn(256, 32).to(torch.bfloat16).float()  # bfloat16 values: what an emulated layer reads
    return model, x, torch.randn(256, 16)


def jumping_run(model, steps, **watch):
    """SGD steps on the same batch, its inputs 1000 times larger from step JUMP on."""
    _, x, y = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    seen = {}
    with preclint.watch(model, optimizer, **watch) as monitor:
        for step in range(steps):
            loss = torch.nn.functional.mse_loss(model(x * (1000.0 if step >= JUMP else 1.0)).float(), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            first = model[0]
            if hasattr(first, "statistics"):
                seen[step] = dict(first.statistics)
    return monitor, seen


def test_the_gradient_formats_are_the_training_recipes():
    assert watch_scaled.GRADIENT_ELEMENTS == GRADIENT_ELEMENTS


def test_nvfp4_block_scales_are_the_recipes():
    model, x, y = mlp()
    weight = model[2].weight.detach().clone()
    grads = {}

    def keep_gradient(module, args, out):
        out.register_hook(lambda g: grads.setdefault("g", g.clone()))

    model[4].register_forward_hook(keep_gradient)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with preclint.watch(model, optimizer, every=1, scaled="all", recipe="nvfp4") as monitor:
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
    layers = monitor.records[0]["layers"]
    forward, gradient = recipes("nvfp4")
    expected = {("0", "input"): scale_statistics(x, forward),
                ("2", "weight"): weight_statistics(weight, "nvfp4", forward),
                ("4", "grad"): scale_statistics(grads["g"], gradient)}  # the expected share of a stochastic rounding
    for (path, operand), stats in expected.items():
        got = layers[path]["scales"][operand]
        assert got["recipe"] == "nvfp4" and got["element"] == "e2m1"
        assert got["scale"] == pytest.approx(stats["scale"], rel=1e-6)
        assert got["underflow_fraction"] == pytest.approx(stats["underflow_fraction"], rel=1e-6, abs=1e-12)
        assert got["saturated_fraction"] == pytest.approx(stats["saturated_fraction"], rel=1e-6, abs=1e-12)
    assert layers["2"]["scales"]["weight"]["block"] == "16x16" and layers["0"]["scales"]["input"]["block"] == 16
    assert layers["0"]["scales"]["input"]["blocks"] == 256 * 32 // 16


def test_delayed_scaling_saturates_at_the_jump_and_not_before():
    model, _, _ = mlp()
    monitor, _ = jumping_run(model, JUMP + 2, every=1, scaled="all", recipe="fp8 amax-history=4")
    by_step = {r["step"]: r for r in monitor.records}
    for step in range(JUMP):
        figures = by_step[step]["layers"]["0"]["delayed"]["input"]
        assert figures["saturated_fraction"] == 0.0, step
        assert not [j for j in by_step[step]["amax_jumps"] if j["operand"] == "input"], step
    at_jump = by_step[JUMP]["layers"]["0"]["delayed"]["input"]
    assert at_jump["saturated_fraction"] > 0.5  # the stale scale, from amax ~4, meets an amax ~4000
    assert at_jump["scale"] == pytest.approx(448 / at_jump["history_amax"], rel=1e-6)
    assert at_jump["amax"] > 500 * at_jump["history_amax"]
    jumps = [(j["step"], j["layer"], j["operand"]) for j in by_step[JUMP]["amax_jumps"]]
    assert (JUMP, "0", "input") in jumps
    # the step after: the jump is in the history, and the scale follows it
    assert by_step[JUMP + 1]["layers"]["0"]["delayed"]["input"]["saturated_fraction"] == 0.0
    # a fresh history's scale is 1.0: the first step reads the input unscaled
    assert by_step[0]["layers"]["0"]["delayed"]["input"]["scale"] == 1.0
    assert monitor.summary()["amax_jumps"] >= 1


@pytest.mark.parametrize("fold", [watch_scaled.FOLD, 2])
def test_a_jump_between_samples_is_listed_in_the_next_record(fold, monkeypatch):
    """(``fold`` 2: the queued amaxes are read every second step, as a long interval's are every FOLD.)"""
    monkeypatch.setattr(watch_scaled, "FOLD", fold)
    model, _, _ = mlp()
    monitor, _ = jumping_run(model, JUMP + 2, every=3, scaled="all", recipe="fp8 amax-history=4")
    assert [r["step"] for r in monitor.records] == [0, 3, 6]
    before = [j for r in monitor.records[:2] for j in r["amax_jumps"] if j["operand"] == "input"]
    assert before == []
    listed = [j for j in monitor.records[2]["amax_jumps"] if j["layer"] == "0" and j["operand"] == "input"]
    assert [j["step"] for j in listed] == [JUMP] and listed[0]["amax"] > 500 * listed[0]["history_amax"]
    assert monitor.records[2]["layers"]["0"]["delayed"]["input"]["saturated_fraction"] == 0.0
    assert monitor.records[2]["amax_jump_count"] >= len(monitor.records[2]["amax_jumps"]) >= 1


def test_a_layer_that_names_its_recipe_is_watched_with_it():
    """preclint's emulated delayed-scaling layers: the monitor's stale scale and saturation are the layer's."""
    model, _, _ = mlp()
    with scaled_recipes({"amax-history": 4}):
        convert_for_training(model, "fp8")
    monitor, seen = jumping_run(model, JUMP + 1, every=1)
    record = monitor.records[JUMP]["layers"]["0"]["delayed"]
    assert record["input"]["recipe"] == "fp8" and record["input"]["amax_history"] == 4
    for operand, key in (("input", "input"), ("weight", "weight"), ("grad", "grad_output")):
        ran = seen[JUMP][key]
        assert record[operand]["scale"] == pytest.approx(ran["tensor_scale"], rel=1e-6)
        assert record[operand]["saturated_fraction"] == pytest.approx(ran["saturated_fraction"], abs=1e-9)
    assert record["input"]["saturated_fraction"] > 0.5
    assert record["grad"]["element"] == "e5m2"


def test_the_report_shows_the_scaled_figures():
    model, _, _ = mlp()
    monitor, _ = jumping_run(model, JUMP + 1, every=1, scaled="all", recipe="fp8 amax-history=4")
    page = render(monitor.records)
    assert "Delayed scaling: values the stale scale saturates" in page
    assert "<td>5</td><td>0</td><td>input</td>" in page  # the jump's row: step, layer, operand


@pytest.mark.parametrize("spec", ["fp4", "fp8 amax-history=x", "nvfp4 amax-history=4", "fp8 margin=1"])
def test_a_recipe_it_does_not_know_is_refused(spec):
    model, _, _ = mlp()
    with pytest.raises(ValueError, match="recipe"):
        preclint.watch(model, torch.optim.SGD(model.parameters(), lr=1e-3), recipe=spec)


def test_ranks_figures_add_up():
    """Under torch.distributed each rank's figures are merged: counts added, shares recomputed over the sum."""
    def record(saturated, nonzero, amax, jump_step):
        delayed = watch_scaled.with_shares(dict(recipe="fp8", element="e4m3", nonzero=nonzero, underflow=0,
                                                saturated=saturated, amax_history=4, scale=100.0, current_scale=448 / amax,
                                                amax=amax, history_amax=4.48))
        scales = watch_scaled.with_shares(dict(recipe="nvfp4", element="e2m1", nonzero=nonzero, underflow=nonzero // 4,
                                               saturated=0, block=16, blocks=10, zero_blocks=0, scale=[1.0, 2.0, 3.0]))
        return dict(layers={"0": LayerCounts(delayed={"input": delayed}, scales={"grad": scales})}, skips=[],
                    skipped=False, nonfinite_gradients=[], first_nonfinite_forward=None, first_nonfinite_backward=None,
                    first_nonfinite_update=None,
                    amax_jumps=[dict(step=jump_step, layer="0", operand="input", amax=amax, history_amax=4.48)])

    merged = merge_records([record(30, 100, 10.0, 5), record(0, 300, 4.0, 6)])
    delayed = merged["layers"]["0"].delayed["input"]
    assert delayed["nonzero"] == 400 and delayed["saturated"] == 30 and delayed["saturated_fraction"] == 30 / 400
    assert delayed["amax"] == 10.0
    scales = merged["layers"]["0"].scales["grad"]
    assert scales["blocks"] == 20 and scales["underflow_fraction"] == 100 / 400 and scales["scale"] == [1.0, 2.0, 3.0]
    assert [(j["step"], j["rank"]) for j in merged["amax_jumps"]] == [(5, 0), (6, 1)]
