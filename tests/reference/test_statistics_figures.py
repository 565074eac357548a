"""The reference pass's cheaper ways to the same figures: the statistics of a tensor on the CPU, the
terms' condition fractions from counts and a batch norm's folded weights without a float64 copy
give, bit for bit, what the general way gives."""
import math

import pytest
import torch

from preclint.reference.analyses.terms import CONDITION_THRESHOLDS, condition_fractions
from preclint.reference.value_stats import tensor_stats


def _values():
    torch.manual_seed(0)
    yield torch.randn(4, 64, 9, 9)  # an activation: mixed signs
    yield torch.relu(torch.randn(2, 32, 7, 7))  # zeros and positives
    yield -torch.rand(100) - 0.5  # all negative
    yield torch.rand(50) + 0.1  # all positive
    yield torch.randn(300).mul(20).round()  # whole numbers
    yield torch.arange(0.0, 40.0)  # whole numbers, with 0
    yield torch.tensor([0.25, -0.0, 0.0])  # below 1: never integer-valued
    yield torch.zeros(5)
    yield torch.tensor([-0.0])
    yield torch.tensor([1e-40, 0.0, 3.0])  # a subnormal
    yield torch.tensor([1.5, 2.0, 4.0, 8.0])  # a fraction where a strided sample may miss it
    yield torch.cat([torch.ones(1000), torch.tensor([1.5])])  # the only fraction is last
    yield torch.tensor([float("inf"), 1.0, -2.0])
    yield torch.tensor([float("nan"), 1.0])
    yield torch.tensor([float("-inf")])
    yield torch.randn(100) * 1e19  # beyond 1e18: the mean square in float64
    yield torch.randn(3, 4).double() * 1e10
    yield torch.randn(64).half()
    yield torch.randn(5, 7).t()  # not contiguous
    yield torch.relu(torch.randn(2, 8, 5, 5)).to(memory_format=torch.channels_last)
    yield torch.randn(6, 6)[1:, ::2]  # an offset and strides
    yield torch.tensor(-3.0)  # no dimensions
    yield torch.tensor([0.0, -0.0, -1e-45, 2.0])  # the least subnormal, negative
    yield torch.tensor([0.0, 3.0, -2.0]).double()
    yield torch.tensor([0.0, -5e-324, 1.0]).double()  # float64's least subnormal
    yield torch.randn(64).bfloat16() * 300


@pytest.mark.parametrize("values", list(_values()), ids=lambda t: f"{t.dtype}-{tuple(t.shape)}")
def test_cpu_statistics_are_those_of_one_readback(values):
    assert repr(tensor_stats(values)) == repr(tensor_stats(values, one_readback=True))


@pytest.mark.parametrize("seed", range(20))
def test_condition_fractions_are_the_float32_means(seed):
    torch.manual_seed(seed)
    ratio = torch.exp(torch.randn(int(torch.randint(1, 50000, ()))) * (seed % 6 + 1))
    ratio[:3] = torch.tensor(CONDITION_THRESHOLDS, dtype=ratio.dtype)  # at a threshold: not above it
    if seed % 3 == 0:
        ratio[3:6] = torch.tensor([math.inf, math.nan, math.nan])
    expected = {t: float((ratio > t).float().mean()) for t in CONDITION_THRESHOLDS}
    assert condition_fractions(ratio) == expected


def test_folded_weight_absmax_is_the_float64_one():
    from preclint.core.ir import Graph
    from preclint.capture.graph import capture
    from preclint.reference.analyses.batchnorm import BatchNormAnalysis, BatchNormFolding

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8)).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(1e-4, 3.0)
        model[1].weight.normal_()
    graph, _ = capture(model, (torch.randn(1, 3, 8, 8),), "net")
    assert isinstance(graph, Graph)
    BatchNormAnalysis().annotate(graph, model)
    (folding,) = [n.record(BatchNormFolding) for n in graph.nodes if n.record(BatchNormFolding) is not None]
    bn = model[1]
    scale = bn.weight.detach().double() / (bn.running_var.double() + bn.eps).sqrt()
    expected = model[0].weight.detach().double().flatten(1).abs().amax(dim=1) * scale.abs()
    assert folding.folded_weight_absmax == float(expected.max())
    assert folding.folds_into == "0"


@pytest.mark.parametrize("seed", range(4))
def test_terms_of_a_conv_are_those_of_the_plain_formula(seed):
    """The terms' record, made with one buffer for the squares, magnitudes and ratios and counted
    with float passes, is what the plain formula (a tensor per step, booleans counted) gives."""
    import torch.nn.functional as F

    from preclint.capture.graph import capture
    from preclint.reference.analyses.terms import Terms, TermsAnalysis
    from preclint.reference.statistics_pass import ReferenceObserver

    torch.manual_seed(seed)
    conv = torch.nn.Conv2d(8, 16, 3, padding=1)
    x = torch.relu(torch.randn(2, 8, 9, 9))
    if seed % 2:
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        conv.weight[0] = 0.0  # a channel of exact zeros: ratio 0 / 1e-30
        conv.bias[0] = 0.0
    graph, _ = capture(conv, (x,), "net", ReferenceObserver([TermsAnalysis()], with_sensitivity=False))
    (node,) = [n for n in graph.nodes if n.record(Terms) is not None]
    with torch.no_grad():
        y = conv(x)
        terms = F.conv2d(x.pow(2), conv.weight.pow(2), None, 1, 1).sqrt()
    ratio = terms / y.abs().clamp_min_(1e-30)
    expected = Terms(float(terms.pow(2).mean().sqrt()),
                     {t: float((ratio > t).float().mean()) for t in CONDITION_THRESHOLDS})
    assert node.record(Terms) == expected
