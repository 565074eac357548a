"""The measuring layer (preclint/measure/): the comparison record on tensors with known answers, the
runners against the probe that users run, one module at a time, and the copies runs are made on."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from preclint.core.findings import ErrorFigure
from preclint.core.numerics import MODES, autocast_policy
from preclint.load.modelio import output_tensors
from preclint.measure.compare import LARGEST, Comparison, NonFinite, Tolerance, compare, relative_rms
from preclint.measure.copies import copy_to
from preclint.measure.program import Program
from preclint.measure.rounding import round_tf32, round_to
from preclint.measure.runners import (EmulatedRunner, FirstNonfinite, NativeRunner, capture_graph, run_mode,
                                      run_reference, runner_for)
from preclint.probe import ProbeOptions, measure_model
from preclint.probe.reference_pass import reference_pass, resolve_reference
from preclint.probe.sweep import sweep
from tests.helpers import check

CPU = torch.device("cpu")
ALL_MODES = tuple(MODES)


# ------------------------------------------------------------------------------ the comparison


def test_a_comparison_gives_the_figures_of_hand_built_outputs():
    reference = [torch.tensor([3.0, 4.0], dtype=torch.float64), torch.tensor([1, 2, 3, 4])]
    outputs = [torch.tensor([3.0, 4.5]), torch.tensor([1, 2, 0, 4])]
    c = compare(outputs, reference, Tolerance(rtol=0.1))
    assert c.rel_rms == pytest.approx(0.5 / 5.0)  # ||(0, 0.5)|| / ||(3, 4)||
    assert c.max_abs == 0.5
    assert c.finite and c.first_nonfinite is None
    assert c.failing_fraction == 0.5  # 4.5 is 0.5 off where 0.1 * 4 = 0.4 allows; 3.0 is exact
    assert c.flip_fraction == 0.25 and c.decisions == 4  # one label of four changed
    assert not c.meets
    assert compare(outputs, reference, Tolerance(rtol=0.2, max_flip=0.25)).meets


def test_without_rtol_or_atol_only_finiteness_and_decisions_count():
    c = compare([torch.tensor([1.0, 2.5])], [torch.tensor([1.0, 2.0], dtype=torch.float64)])
    assert c.failing_fraction is None and c.flip_fraction is None and c.decisions == 0
    assert c.meets and c.rel_rms == pytest.approx(0.5 / math.sqrt(5.0))


def test_the_first_nonfinite_value_is_named_and_the_run_has_no_error_figure():
    reference = [torch.zeros(3, dtype=torch.float64), torch.ones(2, 2, dtype=torch.float64)]
    outputs = [torch.zeros(3), torch.tensor([[1.0, float("nan")], [float("inf"), 1.0]])]
    c = compare(outputs, reference, Tolerance(atol=1.0))
    assert not c.finite and not c.meets
    assert c.rel_rms is None and c.max_abs is None
    assert c.first_nonfinite == NonFinite(output=1, index=1, value=c.first_nonfinite.value)
    assert math.isnan(c.first_nonfinite.value)


def test_class_scores_decide_their_argmax_under_a_flip_budget_only():
    reference = [torch.tensor([[0.1, 0.9], [0.6, 0.4], [0.3, 0.7]], dtype=torch.float64)]
    outputs = [torch.tensor([[0.1, 0.9], [0.4, 0.6], [0.3, 0.7]])]  # the second row's top-1 changed
    assert compare(outputs, reference).flip_fraction is None
    c = compare(outputs, reference, Tolerance(max_flip=0.5))
    assert c.flip_fraction == pytest.approx(1 / 3) and c.decisions == 3 and c.meets
    assert not compare(outputs, reference, Tolerance(max_flip=0.1)).meets


def test_outputs_that_do_not_correspond_count_as_changed_decisions():
    other_count = compare([torch.zeros(2)], [torch.zeros(2), torch.zeros(2)])
    assert other_count == Comparison(ErrorFigure(None, None, 1.0, finite=True), 0, None, False)
    boxes = compare([torch.zeros(3, 4)], [torch.zeros(5, 4, dtype=torch.float64)])  # another number of boxes
    assert boxes.flip_fraction == 1.0 and not boxes.meets
    zeros = compare([torch.zeros(2)], [torch.zeros(2, dtype=torch.float64)])
    assert zeros.rel_rms == 0.0  # an exact run against a reference of zeros
    assert compare([torch.ones(2)], [torch.zeros(2, dtype=torch.float64)]).rel_rms is None  # no scale


def test_the_relative_error_is_the_norm_of_the_difference_over_the_norm_of_the_reference():
    out, ref = [torch.tensor([3.0, 4.0]), torch.tensor([1, 2])], [torch.tensor([3.0, 0.0]), torch.tensor([1, 5])]
    assert relative_rms(out, ref) == pytest.approx(4.0 / 3.0)  # the integer pair is a decision, left out
    assert relative_rms([torch.ones(3)], [torch.ones(2)]) is None  # nothing corresponds
    assert relative_rms([torch.zeros(2)], [torch.zeros(2)]) == 0.0  # exact against zeros
    assert relative_rms([torch.ones(2)], [torch.zeros(2)]) is None  # no scale to be relative to


def test_an_inf_has_no_size_as_an_error_and_is_the_largest_difference_between_two_runs():
    inf, nan = float("inf"), float("nan")
    same = [torch.tensor([inf, nan, 2.0])], [torch.tensor([inf, nan, 1.0])]
    assert relative_rms(*same) is None
    assert relative_rms(*same, nonfinite=LARGEST) == 1.0  # the same inf and NaN in both agree
    assert relative_rms([torch.tensor([inf, 1.0])], [torch.tensor([-inf, 1.0])], nonfinite=LARGEST) == math.inf
    assert relative_rms([torch.tensor([nan, 1.0])], [torch.tensor([1.0, 1.0])], nonfinite=LARGEST) == math.inf


# ------------------------------------------------------------------------------ rounding


def test_tf32_rounding_keeps_10_mantissa_bits_ties_to_even():
    x = torch.tensor([1.0, 1.0 + 2.0**-10, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-12, -2049.0, 3.0e38])
    expected = torch.tensor([1.0, 1.0 + 2.0**-10, 1.0, 1.0 + 2.0**-9, 1.0, -2048.0, 3.0e38])
    rounded = round_tf32(x)
    assert torch.equal(rounded[:-1], expected[:-1])
    assert torch.isfinite(rounded[-1])
    assert torch.equal(round_tf32(torch.tensor([float("inf")])), torch.tensor([float("inf")]))


# ------------------------------------------------------------------------------ the runners


def _small():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(),
                          nn.Linear(8 * 6 * 6, 10), nn.Softmax(-1)).eval()
    return model, (torch.randn(2, 3, 8, 8),)


class _Branchy(nn.Module):
    """Data-dependent control flow (recorded eagerly, not traced) and an in-place ReLU."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = self.fc1(x)
        if float(h.sum()) > -1e9:
            h = torch.relu_(h)
        return self.fc2(h).softmax(-1)


def _branchy():
    torch.manual_seed(0)
    return _Branchy().eval(), (torch.randn(3, 8),)


@pytest.mark.slow
@pytest.mark.parametrize("build", [_small, _branchy], ids=["traced", "recorded"])
def test_an_emulated_runner_returns_what_the_probe_measured(build):
    model, inputs = build()
    _report, graph, _ctx = check(model, inputs, precisions=ALL_MODES)
    program = Program(graph, model)
    ref = reference_pass(program, copy_to(model, CPU, torch.float64), tuple(x.double() for x in inputs), False)
    resolve_reference(ref)
    probed = measure_model(model, inputs, graph, ALL_MODES, ProbeOptions(device="cpu"))
    reference = output_tensors(run_reference(model, inputs))
    for mode in ALL_MODES:
        runner = runner_for(mode, "cpu")
        # (float32 itself has nothing to emulate: the fp32 mode runs its kernels as they are)
        expected = NativeRunner if MODES[mode].floor else EmulatedRunner
        assert isinstance(runner, expected) and runner.how == probed.modes[mode].how
        swept = sweep(program, runner.prepare(model, inputs, graph), ref, graph, keep_errors=False)
        output = runner.output(model, inputs, graph)
        assert torch.equal(output, swept.output), mode  # the run the probe watched, bit for bit
        assert torch.equal(run_mode(model, inputs, mode), output), mode  # its own capture: the same run
        measured = compare(output_tensors(output), reference)
        assert measured.rel_rms == pytest.approx(probed.modes[mode].output.rel_error, rel=1e-9), mode


def test_emulated_tf32_rounds_the_operands_of_products_only():
    class ProductAndSum(nn.Module):
        def forward(self, a, b):
            return a @ b, a + 1e-5

    torch.manual_seed(0)
    a, b = torch.randn(16, 64), torch.randn(64, 16)
    product, total = run_mode(ProductAndSum(), (a, b), "tf32")
    assert torch.equal(product, round_tf32(a) @ round_tf32(b))
    assert not torch.equal(product, a @ b)
    assert torch.equal(total, a + 1e-5)


@pytest.mark.parametrize("name,op", [
    ("softmax", lambda v: F.softmax(v, dim=-1)),
    ("layer_norm", lambda v: F.layer_norm(v, (8,))),
    ("normalize", lambda v: F.normalize(v, dim=-1)),
    ("interpolate", lambda v: F.interpolate(v[None], scale_factor=2.0)),
])
def test_emulated_autocast_runs_in_float32_what_the_predictions_say_it_does(name, op):
    """The emulation and the predictions read one list of the ops autocast runs in float32
    (numerics.AUTOCAST_FP32)."""

    class Op(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return op(self.fc(x))  # the linear stores float16: the op reads it and computes in float32

    assert autocast_policy(name) == "fp32"
    torch.manual_seed(0)
    assert run_mode(Op(), (torch.randn(4, 8),), "fp16").dtype == torch.float32


def test_a_native_runner_runs_the_switch_a_user_flips():
    model, inputs = _small()
    runner = runner_for("bf16", "cpu", emulated=False)
    assert isinstance(runner, NativeRunner) and "torch.autocast('cpu', dtype=torch.bfloat16)" in runner.how
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(*inputs)
    assert torch.equal(runner.output(model, inputs), expected)
    cast = NativeRunner("fp16-full", "cpu").prepare(model, inputs)
    assert cast.variant is not model and all(p.dtype == torch.float16 for p in cast.variant.parameters())
    assert cast.inputs.args[0].dtype == torch.float16 and model[0].weight.dtype == torch.float32


def _two_linears():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 4)).eval(), (torch.randn(3, 8),)


def test_one_module_alone_runs_in_the_mode_and_the_rest_in_float32():
    model, inputs = _two_linears()
    (x,) = inputs
    with torch.no_grad():
        h = model[0](x)
        last = model[1]
        half = lambda t: round_to(t, torch.float16)  # noqa: E731
        expected = F.linear(half(h), half(last.weight), half(last.bias)).half().float()
        emulated = EmulatedRunner("fp16", "cpu")
        prepared = emulated.prepare(model, inputs, capture_graph(model, inputs), only="1")
        assert prepared.variant[0].weight.data_ptr() == model[0].weight.data_ptr()  # float32, shared
        assert torch.equal(emulated.output(model, inputs, only="1"), expected)
        with torch.autocast("cpu", dtype=torch.float16):
            natively = last(h).float()
    assert torch.equal(NativeRunner("fp16", "cpu").output(model, inputs, only="1"), natively)
    with pytest.raises(ValueError, match="casts the whole model"):
        EmulatedRunner("bf16-full", "cpu").prepare(model, inputs, only="1")


def test_the_first_module_whose_output_is_not_finite_is_named():
    model, inputs = _two_linears()
    with torch.no_grad():
        model[1].weight[0, 0] = float("inf")
    watch = FirstNonfinite(model)
    try:
        model(*inputs)
    finally:
        watch.remove()
    assert watch.first == "1"
    model(*inputs)  # the hooks are gone
    assert not model[1]._forward_hooks


# ------------------------------------------------------------------------------ copies


def test_model_copies_are_deep_copies_with_the_tensors_moved():
    # a run copies the user's model (float32 and float64) without touching it: the copy must
    # behave as copy.deepcopy's, with tied weights still tied and mutable attributes not shared
    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 8)
            self.head = nn.Linear(8, 10, bias=False)
            self.head.weight = self.embed.weight
            self.norm = nn.LayerNorm(8)
            self.scales = [1.0, 2.0]

        def forward(self, ids):
            return self.head(self.norm(self.embed(ids)) * self.scales[1])

    torch.manual_seed(0)
    model = Tied().eval()
    ids = torch.randint(0, 10, (2, 5))
    copy64 = copy_to(model, CPU, torch.float64)
    assert copy64.head.weight is copy64.embed.weight and copy64.head.weight.dtype == torch.float64
    assert copy64.norm.normalized_shape == (8,) and copy64.norm.eps == model.norm.eps
    copy64.scales.append(3.0)
    copy64.norm.eps = 0.5
    assert model.scales == [1.0, 2.0] and model.norm.eps == 1e-5
    assert model.embed.weight.dtype == torch.float32
    copy32 = copy_to(model, CPU)
    # parameters that need no move share their memory (a model of billions fits once), as objects of
    # their own: the probe's requires_grad switches on the copy leave the user's model alone
    for a, b in zip(model.parameters(), copy32.parameters()):
        assert a is not b and a.data_ptr() == b.data_ptr()
    copy32.norm.weight.requires_grad_(False)
    assert model.norm.weight.requires_grad
    assert torch.equal(copy32(ids), model(ids))


def test_a_copy_in_place_keeps_each_tensor_on_its_device_and_takes_tensors_with_history():
    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)
            self.scale = self.fc.weight.sum(0) * 0 + 1  # with autograd history: deepcopy refuses it

        def forward(self, x):
            return self.fc(x) * self.scale.detach()

    model = Cached()
    with pytest.raises(RuntimeError, match="deepcopy"):
        __import__("copy").deepcopy(model)
    copy = copy_to(model, None)
    assert copy.scale.grad_fn is None and model.scale.grad_fn is not None
    assert copy.fc.weight.data_ptr() == model.fc.weight.data_ptr() and copy.fc.weight is not model.fc.weight
