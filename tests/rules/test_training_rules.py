"""The training-step rules (PCL6xx) stay silent on the recipes mixed-precision training recommends, and
their predictions agree with a measured step."""
import pytest

from preclint.core.notes import texts
from preclint.rules.model._training import regression
from tests.helpers import check

TRAINING_CODES = {"PCL601", "PCL602", "PCL603", "PCL604"}

CLEAN = [
    pytest.param(regression(precision_loss=1.0, lr=1e-2), ("fp32",), id="fp32-sgd"),
    pytest.param(regression(precision_loss=1.0, optimizer="adam", lr=1e-3), ("bf16",), id="bf16-autocast-adam"),
    pytest.param(regression(precision_loss=1.0, lr=1e-2), ("bf16",), id="bf16-autocast-sgd"),
    pytest.param(regression(precision_loss=1.0, optimizer="adam", lr=1e-3, scaler=True), ("fp16",),
                 id="fp16-autocast-gradscaler-adam"),
    pytest.param(regression(precision_loss=1.0, lr=1e-2, scaler=True), ("fp16",), id="fp16-autocast-gradscaler-sgd"),
]


@pytest.mark.parametrize("build, precisions", CLEAN)
def test_clean_recipes_get_no_training_finding(build, precisions):
    module, inputs, step = build()
    report, _graph, ctx = check(module, inputs, precisions=precisions, train=step)
    assert ctx.training, "the step was checked"
    assert not TRAINING_CODES & {f.code for f in report.findings}, [f.message for f in report.findings]


def test_a_half_model_trains_as_written():
    module, inputs, step = regression(precision_loss=1.0, optimizer="adam", lr=1e-3, dtype="float16")()
    report, _graph, ctx = check(module, inputs, precisions=("fp16", "bf16"), train=step)
    assert list(ctx.training) == ["fp16-full"]
    assert any("checked as written" in note for note in texts(report.notes))
    assert {"PCL603", "PCL604"} <= {f.code for f in report.findings}


def test_predicted_underflow_and_lost_updates_match_a_measured_step():
    from preclint.load.modelio import Inputs
    from preclint.measure.training_step import StepRequest, run_step
    from preclint.predict.training import predict_training
    from preclint.reference.training_step import reference_step
    from preclint.training.statistics import unchanged_fraction

    module, inputs, step = regression()()
    request = StepRequest(module, Inputs(inputs), step)
    predicted = predict_training(reference_step(request, ["fp16"]))["fp16"]
    truth, run = run_step(request, "float64"), run_step(request, "fp16")
    row = next(r for r in predicted.parameters if r.parameter == "0.weight")  # 2048 elements: not one or two
    g64 = truth.parameters["0.weight"].grad
    measured_under = float(((run.parameters["0.weight"].grad == 0) & (g64 != 0)).sum() / (g64 != 0).sum())
    p = run.parameters["0.weight"]
    measured_lost = unchanged_fraction(p.before, p.after, truth.parameters["0.weight"].after - p.before.double())
    for guess, seen in ((row.underflow_fraction, measured_under), (row.lost_update_fraction, measured_lost)):
        assert seen > 0.05 and seen / 3 <= guess <= seen * 3, (guess, seen)


def test_frozen_parameters_are_left_out_of_the_step():
    module, inputs, step = regression()()
    module[0].weight.requires_grad_(False)
    _report, _graph, ctx = check(module, inputs, precisions=("fp16",), train=step)
    rows = {row.parameter for row in ctx.training["fp16"].parameters}
    assert rows == {"0.bias", "2.weight", "2.bias"}
    assert not module[0].weight.requires_grad  # the user's model as it was


def test_a_gradient_that_overflows_float16_is_named_where_it_first_is_not_finite():
    import torch

    from preclint.load.modelio import Inputs
    from preclint.load.training import training_step_of
    from preclint.measure.training_step import StepRequest
    from preclint.probe.training import measure_training
    from preclint.load.loader import LoadedModel

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    inputs = (torch.randn(4, 8),)
    step = training_step_of(loss_fn=lambda output, target: (output * target).sum() * 1e6, targets=torch.ones(4, 4),
                            make_optimizer=lambda params: torch.optim.SGD(params, lr=1e-9))
    report, _graph, ctx = check(module, inputs, precisions=("fp16",), train=step)
    predicted = ctx.training["fp16"]
    assert predicted.first_nonfinite_backward == "2" and predicted.nonfinite_updates == 8 * 16 + 16 + 16 * 4 + 4
    assert "PCL604" in {f.code for f in report.findings}
    loaded = LoadedModel(module, inputs, "model", None, training=step)
    measured = measure_training(loaded, ctx.training_reference, ["fp16"], torch.device("cpu"), [])["fp16"]
    assert measured.first_nonfinite_backward == "2" and measured.nonfinite_updates == predicted.nonfinite_updates
    assert StepRequest(module, Inputs(inputs), step).step is step
