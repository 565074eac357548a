"""The gradient error of ReLU-like masks: where the forward's rounding moves a pre-activation across a kink
the gradient takes or drops a whole term; the prediction (reference/kinks.py) matches an emulated step."""
import pytest
import torch
import torch.nn.functional as F

from preclint.load.modelio import Inputs
from preclint.load.training import training_step_of
from preclint.measure.training_step import StepRequest, run_step
from preclint.predict.training import predict_training
from preclint.probe.training import compare_step
from preclint.reference.kinks import mask_errors
from preclint.reference.training_step import reference_step


def _request(activation):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), activation(), torch.nn.Linear(64, 64), activation(),
                                torch.nn.Linear(64, 1))
    x, y = torch.randn(256, 32), torch.randn(256, 1)
    step = training_step_of(loss_fn=F.mse_loss, targets=y, make_optimizer=lambda p: torch.optim.SGD(p, lr=1e-2))
    return StepRequest(model, Inputs((x,)), step)


def _predicted_and_measured(activation, mode):
    request = _request(activation)
    reference = reference_step(request, [mode])
    return predict_training(reference)[mode].grad_rel_error, compare_step(run_step(request, mode), reference).grad_rel_error


@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_a_relu_mlps_gradient_error_is_predicted_within_3x_and_above_the_tanh_ones(mode):
    relu_predicted, relu_measured = _predicted_and_measured(torch.nn.ReLU, mode)
    tanh_predicted, tanh_measured = _predicted_and_measured(torch.nn.Tanh, mode)
    assert relu_measured / 3 <= relu_predicted <= relu_measured * 3
    assert tanh_measured / 3 <= tanh_predicted <= tanh_measured * 3
    assert relu_predicted > 2 * tanh_predicted  # the masks, not the rounding floor, make the ReLU one's error


class _Functional(torch.nn.Module):
    """Kinks called as functions and in place: leaky_relu, relu_, clamp with constant bounds."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(16, 32), torch.nn.Linear(32, 32), torch.nn.Linear(32, 1)

    def forward(self, x):
        h = F.leaky_relu(self.a(x), 0.1)
        h = torch.relu_(self.b(h)).clamp(max=0.5)
        return self.c(h)


def test_functional_and_in_place_kinks_are_followed_and_grow_with_the_unit_roundoff():
    torch.manual_seed(0)
    step = training_step_of(loss_fn=F.mse_loss, targets=torch.randn(128, 1), make_optimizer=lambda p: torch.optim.SGD(p, lr=1e-2))
    request = StepRequest(_Functional(), Inputs((torch.randn(128, 16),)), step)
    grads = {name: p.grad for name, p in run_step(request, "float64").parameters.items()}
    errors = mask_errors(request, {"fine": 2.0 ** -11, "coarse": 2.0 ** -8}, grads)
    assert set(errors["fine"]) == {"a.weight", "a.bias", "b.weight", "b.bias"}  # c's gradient has no kink after it
    for name in errors["fine"]:
        assert 0 < errors["fine"][name] < errors["coarse"][name]
