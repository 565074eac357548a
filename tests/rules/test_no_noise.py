"""No noise: on well-scaled models no rule fires at default settings.

"A pattern no riskier than ordinary rounding is not a finding": a transformer block with LayerNorm
and an MLP, a normalized residual stack, and torchvision's vit_b_16 at its default init round like
any fp32 model does under TF32, float16 and bfloat16. Any finding there is a false alarm.
"""
import pytest
import torch
import torchvision

from benchmarks.zoo import BY_NAME
from tests.helpers import check


class NormalizedStack(torch.nn.Module):
    def __init__(self, width: int = 64, depth: int = 8):
        super().__init__()
        self.norms = torch.nn.ModuleList(torch.nn.LayerNorm(width) for _ in range(depth))
        self.mlps = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width))
            for _ in range(depth))

    def forward(self, x):
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return x


def _normalized_stack():
    torch.manual_seed(0)
    return NormalizedStack(), (torch.randn(4, 16, 64),)


def _vit_b_16():
    torch.manual_seed(0)
    return torchvision.models.vit_b_16(weights=None), (torch.rand(1, 3, 224, 224),)


@pytest.mark.slow
@pytest.mark.parametrize("build", [BY_NAME["mlp_block"].build, _normalized_stack, _vit_b_16],
                         ids=["attention-mlp-block", "layernorm-mlp-stack", "vit_b_16"])
def test_no_finding_on_a_well_scaled_model(build):
    module, inputs = build()
    report, _, ctx = check(module, inputs)
    assert not report.findings, [(f.code, f.message) for f in report.findings]
    for mode in ctx.modes:  # and the model is predicted to round like any other
        assert ctx.predictions[mode].finite
