"""preclint.testing: the tolerance a precision can meet, per output, and an assert_close that explains
why a comparison failed: the precision, the layers, a precision difference or a real change."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import preclint.testing as pt
from preclint.capture import global_state
from preclint.core.errors import UserError
from preclint.core.tolerances import MARGIN, one_op
from preclint.testing.tolerances import unit_roundoff


class Stack(nn.Module):
    """A small CNN whose activations grow layer by layer, as random-init torchvision CNNs' do: its
    TF32 error is far above torch's default float32 tolerance."""

    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(*[nn.Conv2d(3 if i == 0 else 24, 24, 3, padding=1) for i in range(4)])
        self.head = nn.Linear(24, 10)

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x)) * 3.0
        return self.head(x.mean(dim=(2, 3)))


class TwoHeads(nn.Module):
    """Outputs as torchvision's segmentation models return them: a dict of maps."""

    def __init__(self):
        super().__init__()
        self.body = nn.Conv2d(3, 16, 3, padding=1)
        self.out = nn.Conv2d(16, 5, 1)
        self.aux = nn.Conv2d(16, 5, 1)

    def forward(self, x):
        y = torch.relu(self.body(x))
        return {"out": self.out(y) * 10.0, "aux": self.aux(y)}


@pytest.fixture(scope="module")
def stack():
    torch.manual_seed(0)
    model, x = Stack().eval(), torch.rand(2, 3, 16, 16) * 10
    with torch.no_grad():
        expected = model(x)
    return model, x, expected, pt.tolerance(model, x, "tf32")


@pytest.mark.slow
def test_the_tolerance_passes_tf32_where_the_default_fails(stack):
    model, x, expected, tol = stack
    actual = pt.output_under(model, x, "tf32")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual, expected, **tol.kwargs())
    pt.assert_close(actual, expected, model=model, inputs=x, precision="tf32", tolerance=tol)
    (output,) = tol
    assert output.name == "output" and output.shape == (2, 10) and not output.measured
    assert output.rtol == 4 * 2.0 ** -11 and output.margin == MARGIN
    assert "predicted" in tol.describe() and "rtol = 4u" in output.why


@pytest.mark.slow
def test_predicted_and_measured_agree_within_the_margin(stack):
    model, x, _, predicted = stack
    measured = pt.tolerance(model, x, "tf32", probe="cpu")
    assert measured.measured and measured[0].largest is not None
    assert 1 / MARGIN < predicted[0].sigma / measured[0].sigma < MARGIN


@pytest.mark.slow
def test_a_perturbed_weight_fails_as_a_real_change(stack):
    model, x, expected, tol = stack
    changed = Stack().eval()
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        changed.convs[0].weight.mul_(1.01)  # one weight, 1% off
    actual = pt.output_under(changed, x, "tf32")
    with pytest.raises(AssertionError) as failed:
        pt.assert_close(actual, expected, model=model, inputs=x, precision="tf32", tolerance=tol)
    text = str(failed.value)
    assert "Tensor-likes are not close" in text  # torch's own message first
    assert "computed under tf32" in text and "a real change" in text and "would pass" in text
    assert "The layers that carry tf32's error: head (" in text  # predicted shares, largest first


@pytest.mark.slow
def test_a_tolerance_too_tight_fails_as_a_precision_difference(stack):
    model, x, expected, _ = stack
    tight = pt.tolerance(model, x, "tf32", margin=0.05)
    actual = pt.output_under(model, x, "tf32")
    with pytest.raises(AssertionError, match="Within what tf32 explains .* a precision difference"):
        pt.assert_close(actual, expected, model=model, inputs=x, precision="tf32", tolerance=tight)


@pytest.mark.slow
def test_each_output_gets_its_own_tolerance_and_a_tensor_finds_its_output():
    torch.manual_seed(0)
    model, x = TwoHeads().eval(), torch.rand(1, 3, 8, 8)
    with torch.no_grad():
        expected = model(x)
    tol = pt.tolerance(model, x, "bf16")
    assert [o.name for o in tol] == ["output['out']", "output['aux']"]
    assert tol["out"].atol > 5 * tol["aux"].atol  # ten times the values, ten times the error
    assert tol.for_expected(expected["aux"]) is tol["aux"]
    actual = pt.output_under(model, x, "bf16")
    pt.assert_close(actual["out"], expected["out"], model=model, inputs=x, precision="bf16", tolerance=tol)
    pt.assert_close(actual, expected, model=model, inputs=x, precision="bf16", tolerance=tol)
    with pytest.raises(UserError, match="none of the model's float outputs"):
        pt.assert_close(actual["out"].argmax(1).float(), expected["out"].argmax(1).float(), model=model, inputs=x,
                        precision="bf16", tolerance=tol)


@pytest.mark.slow
def test_one_layer_gets_the_numbers_pcl501_judges_source_by():
    # PCL501 judges a check in source code against one op's tolerance (core/tolerances.one_op):
    # a model that is one linear layer, over as many elements, gets the same within a factor of 1.5
    torch.manual_seed(0)
    model, x = nn.Linear(256, 64), torch.randn(64, 256)
    (output,) = pt.tolerance(model, x, "fp16")
    u = unit_roundoff("fp16")
    assert output.numel == 4096 and output.rtol == one_op(u).rtol
    assert 1 / 1.5 < (output.atol / output.value_rms) / one_op(u).atol < 1.5


@pytest.mark.slow
def test_the_tolerance_leaves_the_process_and_the_model_as_they_were(stack):
    model, x, _, _ = stack
    model.train()
    before = global_state.snapshot()
    pt.tolerance(model, x, "fp16")
    pt.output_under(model, x, "fp16")
    assert global_state.changed(before, global_state.snapshot()) == [] and model.training
    model.eval()


def test_mistakes_are_one_line_errors():
    model, x = Stack(), torch.rand(1, 3, 4, 4)
    with pytest.raises(UserError, match="unknown precision"):
        pt.tolerance(model, x, "fp6")
    with pytest.raises(UserError, match="margin must be"):
        pt.tolerance(model, x, "tf32", margin=0)
    with pytest.raises(UserError, match="no float tensor"):
        pt.tolerance(nn.Identity(), torch.arange(3), "tf32")


@pytest.mark.slow
def test_the_layers_of_failures_are_looked_up_once(stack, monkeypatch):
    # a measured tolerance has no check behind it: the first failure makes the one that names the layers
    import preclint.api

    model, x, expected, _ = stack
    measured = pt.tolerance(model, x, "tf32", probe="cpu")
    calls = []
    real = preclint.api.check
    monkeypatch.setattr(preclint.api, "check", lambda *a, **k: calls.append(1) or real(*a, **k))
    for _ in range(2):
        with pytest.raises(AssertionError, match="The layers that carry tf32's error"):
            pt.assert_close(expected * 1.01, expected, model=model, inputs=x, precision="tf32", tolerance=measured)
    assert len(calls) == 1


def test_the_names_the_docs_give_are_the_classes_named_for_what_they_are():
    import preclint.testing
    from preclint.measure.compare import Tolerance as RunTolerance

    assert preclint.testing.Tolerance is preclint.testing.MeetableTolerance
    assert preclint.testing.OutputTolerance is preclint.testing.OutputBound
    assert preclint.testing.MeetableTolerance is not RunTolerance  # what a test can meet, not what a run must
