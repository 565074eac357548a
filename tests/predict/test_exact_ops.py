"""Ops exact in every format (core/exact_ops.py): the error model predicts no rounding of their own, and
the probe, which skips them, measures none; ops that write constants are exact only where the format
holds their constants."""
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from preclint.core.exact_ops import exact_call, exact_in_dtype, held_exactly
from preclint.core.numerics import BF16, FP16, FP32
from preclint.predict.error_model import predict
from preclint.probe import ProbeOptions, measure_model, tolerance_of
from tests.helpers import check


class FunctionalPool(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return F.max_pool2d(self.conv(x), 2).flatten(1)


def test_held_exactly_is_what_torch_stores():
    for value in (1.0, -1e9, 65504.0, 65505.0, 0.1, 6.0, 2.0**-24, 2.0**-25, 1 + 2.0**-10, 1 + 2.0**-11,
                  float("inf"), float("-inf")):
        for fmt, dtype in ((FP16, torch.float16), (BF16, torch.bfloat16), (FP32, torch.float32)):
            stored = torch.tensor(value, dtype=torch.float64).to(dtype).double().item()
            assert held_exactly(value, fmt) == (stored == value), (value, fmt.name)


def test_an_op_that_writes_a_constant_is_exact_only_where_the_format_holds_it():
    assert exact_call("masked_fill", [-1e4], FP16)
    assert not exact_call("masked_fill", [-1e9], FP16)  # float16 holds at most 65504: it becomes -inf
    assert exact_call("masked_fill", [-1e9], FP32)  # 1e9 = 1953125 * 2^9, 21 significant bits
    assert exact_call("masked_fill", [-1e9], None)  # float64 holds every Python float
    assert not exact_in_dtype("clamp", [0.1], torch.bfloat16) and exact_in_dtype("clamp", [0.0, 6.0], torch.bfloat16)
    assert exact_call("max_pool2d", [-1e9], FP16) and exact_call("relu_", [], FP16)
    assert not exact_call("add", [], FP16)


@pytest.fixture(scope="module")
def functional_pool():
    torch.manual_seed(0)
    model, inputs = FunctionalPool().eval(), (torch.randn(2, 3, 8, 8),)
    _report, graph, ctx = check(model, inputs, precisions=("fp16", "bf16"))
    return model, inputs, graph, ctx


def test_a_functional_max_pool_is_predicted_exact(functional_pool):
    _model, _inputs, graph, _ctx = functional_pool
    pool = next(n for n in graph.nodes if n.fn == "max_pool2d")
    for mode, prediction in predict(graph, ("fp16", "bf16")).items():
        assert prediction.nodes[pool.name].local == 0.0, mode
        assert prediction.nodes[graph.get(pool.inputs[0]).name].local > 0.0, mode  # the conv before it rounds


def test_the_probe_measures_no_local_error_at_a_functional_max_pool(functional_pool):
    model, inputs, graph, ctx = functional_pool
    pool = next(n for n in graph.nodes if n.fn == "max_pool2d")
    result = measure_model(model, inputs, graph, ("fp16", "bf16"), ProbeOptions(device="cpu"),
                           tolerance_of(ctx.rtol, ctx.atol))
    for mode, measure in result.modes.items():
        assert measure.nodes[pool.name].local.rel_error == 0.0, mode
        assert measure.nodes[pool.name].received.rel_error > 0.0, mode
