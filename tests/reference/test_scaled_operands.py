"""ScaledOperands: what each FP8/MX/NVFP4 recipe does to a linear layer's operands, from the reference values."""
import math

import pytest
import torch

from preclint.core.numerics import MODES
from preclint.measure.scaled import quantise
from preclint.reference.analyses.scaled_operands import ScaledOperands, scaled_operands


def test_dot_error_is_the_measured_error_of_the_products():
    torch.manual_seed(0)
    x, w = torch.randn(64, 128), torch.randn(96, 128) * 0.1
    record = scaled_operands(x, w)
    terms = torch.nn.functional.linear(x.double().pow(2), w.double().pow(2)).sqrt().pow(2).mean().sqrt()
    for mode in ("fp8", "mxfp8", "nvfp4"):
        recipe = MODES[mode].recipe
        xq = quantise(x.bfloat16().float(), recipe).double()
        wq = quantise(w, recipe).double()
        measured = float((xq @ wq.T - x.double() @ w.double().T).pow(2).mean().sqrt() / terms)
        predicted = record.combined(mode)
        assert predicted == pytest.approx(measured, rel=0.15), mode


def test_an_outlier_channel_underflows_the_rest_tensorwise_but_not_rowwise_or_blocked():
    torch.manual_seed(1)
    x = torch.randn(32, 64) * 1e-3
    x[:, 7] = 3000.0  # a massive activation channel
    record = scaled_operands(x, torch.randn(32, 64))
    tensorwise, rowwise, mx = (record.modes[m]["input"] for m in ("fp8", "fp8-rowwise", "mxfp8"))
    assert tensorwise.underflow > 0.9  # 1e-3 * 448 / 3000 is below E4M3's smallest subnormal
    assert rowwise.underflow > 0.9  # every row holds the outlier too
    # the 32-blocks that hold channel 7 lose their other values, the blocks without it keep theirs
    assert mx.underflow == pytest.approx(31 / 64, abs=0.02) and mx.group_underflow[0] == 0.0
    assert record.channel_absmax[7] == pytest.approx(3000.0, rel=1e-2)
    assert record.channel_rms_median < 0.01


def test_a_zero_row_is_counted_and_floored():
    x = torch.randn(8, 32)
    x[3] = 0.0
    rowwise = scaled_operands(x, torch.randn(16, 32)).modes["fp8-rowwise"]["input"]
    assert rowwise.zero_groups == 1 and not rowwise.nonfinite
    assert math.isfinite(rowwise.scale_range[1])


def test_rejected_shapes_are_said_per_recipe():
    record = scaled_operands(torch.randn(4, 48), torch.randn(10, 48))
    assert "multiples of 16" in record.rejected["fp8"]
    record = scaled_operands(torch.randn(4, 48), torch.randn(32, 48))
    assert "fp8" not in record.rejected and "block of 32" in record.rejected["mxfp8"]
    assert "nvfp4" not in record.rejected


@pytest.mark.slow
def test_the_reference_pass_records_it_for_linear_modules_only():
    from tests.helpers import check

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 32)
            self.conv = torch.nn.Conv1d(4, 4, 1)

        def forward(self, x):
            return self.conv(self.fc(x))

    _, graph, _ = check(Net(), (torch.randn(2, 4, 32),), precisions=("fp8",))
    recorded = {n.module_path for n in graph.nodes if n.record(ScaledOperands) is not None}
    assert recorded == {"fc"}
    _, graph, _ = check(Net(), (torch.randn(2, 4, 32),), precisions=("bf16",))
    assert not any(n.record(ScaledOperands) for n in graph.nodes)  # computed only for scaled modes


def test_a_reduction_of_fewer_than_a_block_is_rejected_and_not_grouped_across_rows():
    """K = 16 under MXFP8's blocks of 32: reshaping the (8, 16) input into 32-blocks would mix two
    rows in a block (and fails outright where the element count is no multiple of 32)."""
    torch.manual_seed(0)
    record = scaled_operands(torch.randn(1, 16), torch.randn(16, 16))
    assert "mxfp8" in record.rejected and "mxfp8" not in record.modes
    assert "nvfp4" in record.modes and "fp8" in record.modes  # blocks of 16 fit; tensorwise always does
