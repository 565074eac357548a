"""The training step under the FP8 recipes: the emulated GEMMs quantise on the real float8 grids, the
predicted flushes match a measured emulated step, and a clean recipe gets no training finding."""
import math

import pytest
import torch

from preclint.core.notes import texts
from preclint.core.numerics import E4M3, MODES, Recipe
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


def test_the_training_modes_include_the_scaled_recipes_that_train():
    from preclint.measure.training_step import TRAINING_MODES

    assert {"fp8", "fp8-rowwise", "mxfp8"} <= set(TRAINING_MODES)
    assert MODES["nvfp4"].recipe is not None and "nvfp4" not in TRAINING_MODES


def test_nvfp4_says_it_has_no_training_step():
    module, inputs, step = classifier()()
    report, _graph, ctx = check(module, inputs, precisions=("fp8", "nvfp4"), train=step)
    assert list(ctx.training) == ["fp8"]
    assert any("no training step under nvfp4" in note for note in texts(report.notes))
