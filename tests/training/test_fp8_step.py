"""The training step under the FP8 recipes: the emulated GEMMs quantise on the real float8 grids, the
predicted flushes match a measured emulated step, and a clean recipe gets no training finding."""
import math

import pytest
import torch

from preclint.core.notes import texts
from preclint.core.numerics import E4M3, Recipe
from preclint.measure.grouped import quantise_along
from preclint.measure.scaled_training import TrainingScaledLinear, recipes
from preclint.rules.model._training import classifier
from preclint.measure.scale_statistics import scale_statistics
from tests.helpers import check

TRAINING_CODES = {"PCL601", "PCL602", "PCL603", "PCL604", "PCL605"}


def test_tensorwise_e5m2_gradients_round_as_a_float8_e5m2_cast():
    torch.manual_seed(0)
    g = torch.randn(64, 48) * torch.logspace(-12, 0, 48)  # columns from 1e-12 to 1: some below E5M2's span
    _, gradient = recipes("fp8")
    q = quantise_along(g, gradient, -1)
    scale = 57344.0 / float(g.abs().max())
    cast = (g * scale).to(torch.float8_e5m2).float() / scale
    assert torch.equal(q.values, cast)
    flushed = (g != 0) & (cast == 0)
    assert 0 < int(flushed.sum()) < g.numel()
    assert scale_statistics(g, gradient)["underflow_fraction"] == pytest.approx(float(flushed.double().mean()))


def test_grouping_along_a_dimension_pads_blocks_and_keeps_the_shape():
    recipe = Recipe("block", E4M3, block=32, scale="fp32")
    t = torch.zeros(5, 40)
    t[:, 0], t[:, 39] = 1e6, 1.0  # K = 40: a block of 32 and a padded one of 8
    q = quantise_along(t, recipe, -1)
    assert q.values.shape == t.shape and q.scale.numel() == 10
    assert torch.equal(q.values[:, 39], torch.ones(5))  # its own block's scale keeps it beside the 1e6
    along_rows = quantise_along(t, recipe, 0)  # groups down the columns (5 rows padded to 32)
    assert along_rows.values.shape == t.shape and torch.equal(along_rows.values, t)


def test_the_emulated_layer_returns_gradients_of_its_inputs_shapes():
    torch.manual_seed(0)
    layer = TrainingScaledLinear(torch.nn.Linear(32, 16), "fp8")
    x = torch.randn(2, 8, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (2, 8, 16)
    y.float().pow(2).sum().backward()
    reference = torch.nn.functional.linear(x.detach().double(), layer.weight.detach().double(), layer.bias.detach().double())
    grad_w = (2 * reference).reshape(-1, 16).t() @ x.detach().double().reshape(-1, 32)
    error = float((layer.weight.grad.double() - grad_w).norm() / grad_w.norm())
    assert x.grad.shape == x.shape and 0 < error < 0.15  # E4M3 and E5M2 rounding, not a wrong product
    assert set(layer.statistics) == {"input", "weight", "grad_output"}


def _predicted_and_measured(build, mode):
    from preclint.load.modelio import Inputs
    from preclint.measure.training_step import StepRequest, run_step
    from preclint.predict.training import predict_training
    from preclint.probe.training import compare_step
    from preclint.reference.training_step import reference_step

    module, inputs, step = build()
    request = StepRequest(module, Inputs(inputs), step)
    reference = reference_step(request, [mode])
    return predict_training(reference)[mode], compare_step(run_step(request, mode), reference)


@pytest.mark.parametrize("mode", ["fp8", "fp8-rowwise"])
def test_predicted_flushes_match_an_emulated_step(mode):
    predicted, measured = _predicted_and_measured(classifier(temperature=0.01), mode)
    head_predicted = predicted.scaled["4"]["grad_output"]["underflow_fraction"]
    head_measured = measured.scaled["4"]["grad_output"]["underflow_fraction"]
    assert head_measured > 0.5 and head_measured / 3 <= head_predicted <= head_measured * 3
    assert measured.underflow_fraction > 0.01
    assert measured.underflow_fraction / 3 <= predicted.underflow_fraction <= measured.underflow_fraction * 3
    assert measured.lost_update_fraction / 3 <= predicted.lost_update_fraction <= measured.lost_update_fraction * 3
    blocks = predicted.scaled["4"]["grad_output"]["blocks"]
    assert blocks["underflow_fraction"][0] <= blocks["underflow_fraction"][1] <= blocks["underflow_fraction"][2]
    assert predicted.scaled["4"]["input"]["underflow_fraction"] == 0.0  # the forward's operands keep their values


def test_the_report_carries_the_scale_statistics_and_a_clean_recipe_gets_no_training_finding():
    module, inputs, step = classifier()()
    report, _graph, ctx = check(module, inputs, precisions=("fp8",), train=step)
    assert not TRAINING_CODES & {f.code for f in report.findings}, [f.message for f in report.findings]
    entry = report.summary["fp8"]["training"]["predicted"]
    assert entry["scaled_gradient_underflow_fraction"] == 0.0
    head = entry["scaled"]["4"]
    assert head["grad_output"]["element"] == "e5m2" and head["input"]["element"] == "e4m3"
    assert head["grad_output"]["tensor_scale"] == pytest.approx(57344.0 / head["grad_output"]["amax"])
    assert len(head["weight"]["blocks"]["scale"]) == 3 and all(math.isfinite(v) for v in head["weight"]["blocks"]["scale"])


def test_a_flushing_head_is_found_and_confirmed_by_the_probe():
    from preclint.load.loader import LoadedModel
    from preclint.probe.training import judge_training, measure_training

    module, inputs, step = classifier(temperature=0.01)()
    report, _graph, ctx = check(module, inputs, precisions=("fp8",), train=step)
    (finding,) = [f for f in report.findings if f.code == "PCL605"]
    assert finding.module == "4" and "E5M2" in finding.message and "--scaling keep=4" in finding.fix
    loaded = LoadedModel(module, inputs, "model", None, training=step)
    measured = measure_training(loaded, ctx.training_reference, ["fp8"], torch.device("cpu"), [])
    judge_training([finding], measured, ctx.training)
    assert finding.status == "confirmed"


def test_the_training_modes_include_the_scaled_recipes():
    from preclint.measure.training_step import TRAINING_MODES

    assert {"fp8", "fp8-rowwise", "mxfp8", "nvfp4"} <= set(TRAINING_MODES)


def test_stochastic_rounding_lands_on_the_grid_and_keeps_the_expectation():
    from preclint.core.numerics import E2M1
    from preclint.measure.scaled import round_stochastic

    generator = torch.Generator().manual_seed(0)
    for value, neighbours in ((0.3, {0.0, 0.5}), (2.4, {2.0, 3.0}), (5.0, {4.0, 6.0}), (9.0, {6.0})):
        drawn = round_stochastic(torch.full((100_000,), value), E2M1, generator)
        assert set(drawn.unique().tolist()) == neighbours
        assert float(drawn.mean()) == pytest.approx(min(value, 6.0), rel=0.01)


def test_the_hadamard_transform_keeps_the_weight_gradient_and_spreads_an_outlier():
    from preclint.measure.nvfp4_training import rotated

    torch.manual_seed(0)
    g, x = torch.randn(40, 24, dtype=torch.float64), torch.randn(40, 8, dtype=torch.float64)  # M = 40: padded to 48
    assert torch.allclose(rotated(g).t() @ rotated(x), g.t() @ x, atol=1e-12)
    spike = torch.zeros(16, 1, dtype=torch.float64)
    spike[3] = 1.0
    assert torch.allclose(rotated(spike).abs(), torch.full((16, 1), 0.25, dtype=torch.float64))


def test_nvfp4_weights_share_a_scale_per_16_by_16_tile():
    from preclint.measure.nvfp4_training import quantise_weight_2d

    forward, _ = recipes("nvfp4")
    w = torch.ones(32, 32) * 0.01
    w[0, 0] = 6.0  # one large value: its tile's scale leaves 0.01 below E2M1's smallest step, the others keep it
    q = quantise_weight_2d(w, forward)
    assert float(q[1:16, 1:16].abs().max()) == 0.0
    assert torch.allclose(q[16:, 16:], w[16:, 16:], rtol=0.07) and torch.allclose(q[:16, 16:], w[:16, 16:], rtol=0.07)


def test_nvfp4_trains_and_its_predicted_flushes_match_an_emulated_step():
    predicted, measured = _predicted_and_measured(classifier(temperature=0.01), "nvfp4")
    for operand in ("grad_output", "grad_output_wgrad"):
        guess = predicted.scaled["4"][operand]["underflow_fraction"]
        seen = measured.scaled["4"][operand]["underflow_fraction"]
        assert seen > 0.5 and seen / 3 <= guess <= seen * 3, (operand, guess, seen)
    assert predicted.scaled["4"]["grad_output"]["element"] == "e2m1"
    assert measured.underflow_fraction > 0.01
    assert measured.underflow_fraction / 3 <= predicted.underflow_fraction <= measured.underflow_fraction * 3
    assert measured.grad_rel_error / 3 <= predicted.grad_rel_error <= measured.grad_rel_error * 3


def test_a_clean_nvfp4_recipe_gets_no_training_finding():
    module, inputs, step = classifier()()
    report, _graph, ctx = check(module, inputs, precisions=("nvfp4",), train=step)
    assert list(ctx.training) == ["nvfp4"]
    assert not TRAINING_CODES & {f.code for f in report.findings}, [f.message for f in report.findings]


def test_flushed_gradients_and_lost_updates_are_judged_under_a_scaled_recipe_and_confirmed():
    from preclint.load.loader import LoadedModel
    from preclint.probe.training import judge_training, measure_training

    module, inputs, step = classifier(temperature=0.01)()
    report, _graph, ctx = check(module, inputs, precisions=("fp8-rowwise",), train=step)
    found = {f.code: f for f in report.findings if f.code in ("PCL601", "PCL602")}
    assert set(found) == {"PCL601", "PCL602"}
    assert "E4M3 gradient scales flush" in found["PCL601"].message and "--scaling keep=4" in found["PCL601"].fix
    assert found["PCL602"].module == "4"
    loaded = LoadedModel(module, inputs, "model", None, training=step)
    measured = measure_training(loaded, ctx.training_reference, ["fp8-rowwise"], torch.device("cpu"), [])
    judge_training(list(found.values()), measured, ctx.training)
    assert [f.status for f in found.values()] == ["confirmed", "confirmed"]


def test_a_recipe_that_flushes_a_head_but_few_weight_gradients_gets_no_step_finding():
    module, inputs, step = classifier(temperature=0.01)()
    report, _graph, ctx = check(module, inputs, precisions=("mxfp8",), train=step)
    figures = ctx.training["mxfp8"]
    assert figures.underflow_fraction < 0.01  # E8M0 scales per 32: the head's flushed values add up in dW
    assert figures.lost_update_fraction - figures.float32_lost_update_fraction < 0.01
    assert {f.code for f in report.findings} & TRAINING_CODES == {"PCL605"}


def test_a_delayed_scale_comes_from_the_amax_of_earlier_steps():
    from dataclasses import replace as changed

    from preclint.core.numerics import scaled_mode

    assert scaled_mode("fp8", {"amax-history": "3"}).recipe.amax_history == 3
    with pytest.raises(ValueError):
        scaled_mode("fp8", {"amax-history": "-1"})
    layer = TrainingScaledLinear(torch.nn.Linear(16, 16), "fp8")
    layer.forward_recipe = changed(layer.forward_recipe, amax_history=2)
    scales = [layer.delayed_scale("input", torch.tensor([amax])) for amax in (4.0, 2.0, 1.0, 0.5)]
    assert scales == [1.0, 448.0 / 4.0, 448.0 / 4.0, 448.0 / 2.0]  # a fresh history's 1.0, then the last 2 steps' max


def test_a_delayed_recipe_first_step_is_predicted_and_later_steps_measured():
    from preclint.core.numerics import scaled_recipes
    from preclint.load.modelio import Inputs
    from preclint.measure.training_step import StepRequest
    from preclint.measure.trajectory import trajectories
    from preclint.rules.model._training import regression

    build = regression(optimizer="adam", lr=1e-3)  # gradients near 1e-6: below E5M2's 7.6e-6 at a scale of 1.0
    module, inputs, step = build()
    report, _graph, ctx = check(module, inputs, precisions=("fp8",), train=step, scaling={"amax-history": 16})
    assert {"PCL601", "PCL605"} <= {f.code for f in report.findings}
    with scaled_recipes({"amax-history": 16}):
        predicted, measured = _predicted_and_measured(build, "fp8")
        path = trajectories(StepRequest(module, Inputs(inputs), step), ["fp8"], 3)["fp8"]
    assert predicted.scaled_gradient_underflow == measured.scaled_gradient_underflow == 1.0
    assert measured.underflow_fraction / 3 <= predicted.underflow_fraction <= measured.underflow_fraction * 3
    assert path.scaled_gradient_underflow[0] == 1.0 and path.scaled_gradient_underflow[1:] == [0.0, 0.0]
    _report, _graph, current = check(module, inputs, precisions=("fp8",), train=step)
    assert current.training["fp8"].scaled_gradient_underflow == 0.0


def test_a_forward_check_says_delayed_scaling_is_the_training_steps_only():
    from preclint.rules.model._training import regression

    module, inputs, _step = regression()()
    report, _graph, _ctx = check(module, inputs, precisions=("fp8",), scaling={"amax-history": 16})
    assert any("amax history 16) is modelled in --train's step only" in note for note in texts(report.notes))
