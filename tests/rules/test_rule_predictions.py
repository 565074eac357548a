"""The rule pack PCL102/104/201/202/203/204 and the error model they stand on.

Beyond the examples every rule runs (test_rule_examples.py): severities, the figures the findings
predict against errors measured by running the reduced precision on the CPU (preclint.measure's
runners: the probe's emulation), what each rule says under --no-run, and the facts of the error
model (kernels without TF32, exact integer arithmetic, underflow, promotion in cast models, scan
accumulation).
"""
import math

import pytest
import torch

from preclint.core.ir import Kind, Node, TensorStats
from preclint.core.numerics import MODES
from preclint.load.modelio import output_tensors
from preclint.measure.compare import compare
from preclint.measure.runners import run_mode, run_reference
from preclint.predict.accumulation import accumulation_error
from preclint.predict.formats import node_format
from preclint.predict.local import exact_integers
from preclint.predict.tf32 import tensor_core_tf32
from preclint.rules.model.error_amplification import ErrorAmplification
from preclint.rules.model.cancellation import Cancellation
from preclint.rules.model.unrepresentable_constant import UnrepresentableConstant
from preclint.rules.model.integer_precision import IntegerPrecision
from preclint.rules.model.low_precision_reduction import LowPrecisionReduction
from preclint.rules.model.low_precision_statistics import LowPrecisionStatistics
from tests.helpers import check, check_example

PACK = ("PCL102", "PCL104", "PCL201", "PCL202", "PCL203", "PCL204")


def findings(report, code):
    return [f for f in report.findings if f.code == code]


def measured_rel_error(module, inputs, mode):
    """Relative RMS error of the output, running ``mode`` on the CPU as the probe does, against float64."""
    measured = compare(output_tensors(run_mode(module, inputs, mode)), output_tensors(run_reference(module, inputs)))
    assert measured.finite, (mode, measured.first_nonfinite)
    return measured.rel_rms


def within(predicted, measured, factor=3.0):
    return measured / factor <= predicted <= measured * factor


# ----------------------------------------------------------------------------------------- PCL102


def test_lost_eps_guarding_a_root_is_an_error():
    report, _, _ = check_example(UnrepresentableConstant.bad[0])
    (finding,) = findings(report, "PCL102")
    assert finding.severity == "error"
    assert "is 0 in float16" in finding.message and "sqrt" in finding.message
    assert finding.precisions == ("fp16",)  # bfloat16 holds 1e-8; TF32 stores nothing in a reduced format


def test_mask_value_beyond_float16_raises_in_masked_fill():
    report, _, _ = check_example(UnrepresentableConstant.bad[1])
    (finding,) = findings(report, "PCL102")
    assert finding.severity == "error" and "raises" in finding.message
    module, inputs = UnrepresentableConstant.bad[1].build()
    with pytest.raises(RuntimeError, match="without overflow"):  # what the finding says, on the CPU's own kernels
        run_mode(module, inputs, "fp16", emulated=False)


def test_subnormal_eps_that_guards_nothing_is_a_warning():
    class Shift(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.proj(x) + 1e-6  # subnormal in float16, and it guards no division

    report, _, _ = check(Shift(), (torch.randn(2, 8),))
    (finding,) = findings(report, "PCL102")
    assert finding.severity == "warning" and "subnormal" in finding.message


def test_constants_from_finfo_follow_the_dtype():
    report, _, _ = check_example(UnrepresentableConstant.good[0])
    assert not findings(report, "PCL102")


def test_constants_are_judged_without_the_reference_pass():
    module, inputs = UnrepresentableConstant.bad[0].build()
    report, _, _ = check(module, inputs, run=False)
    assert [f.severity for f in findings(report, "PCL102")] == ["error"]


# ----------------------------------------------------------------------------------------- PCL104


@pytest.mark.slow
def test_positions_beyond_the_exact_range_name_the_step():
    report, _, _ = check_example(IntegerPrecision.bad[0])
    (finding,) = findings(report, "PCL104")
    assert set(finding.precisions) == {"tf32", "fp16", "bf16"}
    # 4095 in bfloat16 rounds to multiples of 16, in float16/TF32 to multiples of 2
    assert finding.predicted["bf16"].max_abs_error == 8.0
    assert finding.predicted["fp16"].max_abs_error == 1.0
    assert "multiples of 16" in finding.message


@pytest.mark.slow
def test_rounding_flips_match_a_real_run():
    module, inputs = IntegerPrecision.bad[1].build()
    report, _, _ = check(module, inputs, precisions=("fp16", "bf16"))
    by_mode = {m: f.predicted[m].flip_fraction for f in findings(report, "PCL104") for m in f.precisions
               if f.predicted[m].flip_fraction is not None}
    reference = run_reference(module, inputs, dtype=None)
    for mode in ("fp16", "bf16"):
        measured = float((run_mode(module, inputs, mode) != reference).double().mean())
        assert within(by_mode[mode], measured), (mode, by_mode[mode], measured)


@pytest.mark.slow
def test_exact_integer_arithmetic_carries_no_error():
    report, _, _ = check_example(IntegerPrecision.good[1])
    assert not findings(report, "PCL104")


# ----------------------------------------------------------------------------------------- PCL201


@pytest.mark.slow
def test_squares_of_large_deviations_overflow_float16_statistics():
    report, _, ctx = check_example(LowPrecisionStatistics.bad[0])
    (finding,) = findings(report, "PCL201")
    assert finding.severity == "error" and "above float16" in finding.message
    assert "pow" in finding.message  # says why autocast did not save it
    assert not ctx.predictions["fp16"].finite
    module, inputs = LowPrecisionStatistics.bad[0].build()
    assert measured_rel_error(module, inputs, "fp16") > 0.5  # the normalized values collapse for real


@pytest.mark.slow
def test_pow_is_upcast_under_autocast_but_not_in_a_cast_model():
    class PowNorm(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
            with torch.no_grad():
                self.conv.weight.mul_(400.0)

        def forward(self, x):
            h = self.conv(x)
            d = h - h.mean(1, keepdim=True)
            return d / torch.sqrt(d.pow(2).mean(1, keepdim=True) + 1e-4)

    torch.manual_seed(0)
    report, _, _ = check(PowNorm(), (torch.randn(1, 3, 16, 16),), precisions=("fp16", "fp16-full"))
    assert [f.precisions for f in findings(report, "PCL201")] == [("fp16-full",)]


def test_variance_below_the_normal_range_is_an_underflow():
    report, _, ctx = check_example(LowPrecisionStatistics.bad[1])
    (finding,) = findings(report, "PCL201")
    assert "smallest normal" in finding.message
    assert not ctx.predictions["fp16"].finite  # var -> 0 and eps -> 0: the division gives inf


# ----------------------------------------------------------------------------------------- PCL202


@pytest.mark.slow
def test_long_products_in_a_cast_model_grow_with_the_length():
    report, _, _ = check_example(LowPrecisionReduction.bad[0])
    (finding,) = findings(report, "PCL202")
    assert set(finding.precisions) == {"fp16-full", "bf16-full"}
    assert "256" in finding.message
    # autocast runs cumprod in float32: nothing to report under the default precisions
    module, inputs = LowPrecisionReduction.bad[0].build()
    report, _, _ = check(module, inputs)
    assert not findings(report, "PCL202")


def test_scan_accumulation_law_grows_with_the_length():
    def scan(n):
        return Node("cumsum", Kind.SCAN, "torch.cumsum", fn="cumsum", reduction_length=n,
                    outputs=[TensorStats((n,), "float32", n, 1.0, 1.0)])

    small, large = accumulation_error(scan(256), "fp16"), accumulation_error(scan(65536), "fp16")
    assert 3 < large / small < 10  # measured on an H200: n^0.37
    assert accumulation_error(scan(4096), "fp32") == 0.0
    total = Node("sum", Kind.REDUCTION, "torch.sum", fn="sum", reduction_length=10**6)
    assert accumulation_error(total, "fp16") == 0.0  # sums accumulate in float32


def test_fp16_accumulation_flag_makes_long_gemms_a_finding():
    matmul = torch.backends.cuda.matmul
    if not hasattr(matmul, "allow_fp16_accumulation"):
        pytest.skip("torch without allow_fp16_accumulation")
    torch.manual_seed(0)
    model, inputs = torch.nn.Sequential(torch.nn.Linear(16384, 64), torch.nn.Linear(64, 64)), (torch.randn(4, 16384),)
    saved = matmul.allow_fp16_accumulation
    matmul.allow_fp16_accumulation = True  # as a model file that sets it at import would
    try:
        report, _, _ = check(model, inputs, precisions=("fp16", "bf16"))
    finally:
        matmul.allow_fp16_accumulation = saved
    (finding,) = findings(report, "PCL202")
    assert finding.module == "0" and finding.precisions == ("fp16",)  # K=64 stays ordinary; bf16 GEMMs are unaffected
    report, _, _ = check(model, inputs, precisions=("fp16",))
    assert not findings(report, "PCL202")


# ----------------------------------------------------------------------------------------- PCL203


def test_cancellation_says_which_atol_is_honest_and_matches_a_real_run():
    module, inputs = Cancellation.bad[0].build()
    report, _, _ = check(module, inputs, precisions=("fp16", "bf16"))
    (finding,) = findings(report, "PCL203")
    assert "atol >=" in finding.fix and "outputs are over 100 times smaller" in finding.message
    for mode in ("fp16", "bf16"):
        assert within(finding.predicted[mode].rel_error, measured_rel_error(module, inputs, mode))


# ----------------------------------------------------------------------------------------- PCL204


@pytest.mark.slow
@pytest.mark.parametrize("example", ErrorAmplification.bad, ids=lambda e: e.description[:30])
def test_amplification_names_its_sources_and_matches_a_real_run(example):
    module, inputs = example.build()
    report, _, ctx = check(module, inputs, precisions=("fp16", "bf16"))
    (finding,) = findings(report, "PCL204")
    assert "amplifies the relative error of its input" in finding.message and "magnifying the rounding of" in finding.message
    for mode in ("fp16", "bf16"):
        measured = measured_rel_error(module, inputs, mode)
        assert within(finding.predicted[mode].rel_error, measured), (mode, finding.predicted[mode].rel_error, measured)
        assert within(ctx.predictions[mode].rel_error, measured)


# ------------------------------------------------------------------------------------ --no-run


@pytest.mark.parametrize("rule", [IntegerPrecision, LowPrecisionStatistics, LowPrecisionReduction, Cancellation,
                                  ErrorAmplification], ids=lambda r: r.code)
def test_rules_that_need_the_reference_pass_say_so(rule):
    example = rule.bad[0]
    module, inputs = example.build()
    report, _, _ = check(module, inputs, run=False, **example.options)
    found = findings(report, rule.code)
    assert found and all(f.severity == "info" and "--no-run" in f.message for f in found)


# ------------------------------------------------------------------------------ the error model


def _conv(in_channels, groups, out_shape):
    stats = TensorStats(out_shape, "float32", math.prod(out_shape), 1.0, 1.0)
    return Node("c", Kind.CONV, "nn.Conv2d", fn="conv2d", groups=groups, outputs=[stats],
                attrs={"in_channels": in_channels, "groups": groups})


def test_tf32_skips_the_kernels_measured_without_it():
    assert tensor_core_tf32(_conv(64, 1, (1, 64, 56, 56)))
    assert not tensor_core_tf32(_conv(3, 1, (1, 64, 112, 112)))  # RGB stem
    assert not tensor_core_tf32(_conv(64, 64, (1, 64, 56, 56)))  # depthwise
    assert not tensor_core_tf32(_conv(480, 1, (1, 120, 1, 1)))  # 1x1 conv on pooled features: one row
    one_row = Node("fc", Kind.LINEAR, "nn.Linear", fn="linear", outputs=[TensorStats((1, 1000), "float32", 1000)])
    batch = Node("fc", Kind.LINEAR, "nn.Linear", fn="linear", outputs=[TensorStats((8, 1000), "float32", 8000)])
    assert not tensor_core_tf32(one_row) and tensor_core_tf32(batch)


def test_whole_numbers_are_exact_below_the_format_limit():
    def add(absmax):
        whole = TensorStats((4,), "float32", 4, absmax, absmax, 1.0, True, True)
        return Node("add", Kind.ELEMENTWISE, "operator.add", fn="add", outputs=[whole], input_stats=[whole, whole])

    assert exact_integers(add(255.0), "bf16") and not exact_integers(add(4095.0), "bf16")
    assert exact_integers(add(2048.0), "fp16")


def test_a_cast_model_keeps_float32_constants_and_promotes():
    constant = Node("t", Kind.CONSTANT, "torch.arange", fn="arange", attrs={"dtype": "float32"})
    assert node_format(constant, MODES["bf16-full"], []) == "fp32"
    mixed = Node("mul", Kind.ELEMENTWISE, "operator.mul", fn="mul")
    assert node_format(mixed, MODES["bf16-full"], ["fp32", "bf16"]) == "fp32"
    assert node_format(mixed, MODES["bf16-full"], ["bf16", "bf16"]) == "bf16"


def test_vanishing_activations_are_predicted_to_flush_to_zero():
    class Vanishing(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(32, 32)
            self.b = torch.nn.Linear(32, 32)
            with torch.no_grad():
                self.a.weight.mul_(1e-4)
                self.a.bias.zero_()
                self.b.bias.zero_()

        def forward(self, x):
            return self.b(self.a(x) * 1e-4)  # values around 1e-9: 0 in float16

    torch.manual_seed(0)
    module, inputs = Vanishing(), (torch.randn(4, 32),)
    _, _, ctx = check(module, inputs, precisions=("fp16",))
    assert measured_rel_error(module, inputs, "fp16") == pytest.approx(1.0)
    assert ctx.predictions["fp16"].rel_error > 1 / 3
