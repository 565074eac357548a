"""PCL106 scale-amax-zero: a group of a scaled GEMM's operand whose amax is 0 gets an infinite scale."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, percent
from preclint.core.numerics import SCALED_MODES
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.rules.base import Example, Rule
from preclint.rules.model._scaled import GROUP_WORDS, operands_where


def _padded_batch():
    """A batch whose last sequence is padding: its tokens' activations are all zero."""
    import torch

    torch.manual_seed(0)
    x = torch.randn(2, 8, 32)
    x[1, 4:] = 0.0  # padded positions, zeroed by the attention mask upstream
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 32)).eval(), (x,)


def _reach(recipe, operand: str, q) -> str:
    """How much of the layer's output the NaN reaches: a row of the input reaches its output row, a row
    of the weight its output feature, a tensor scale every output."""
    if recipe.granularity == "tensor":
        return ": every output of the layer is NaN"
    if recipe.granularity == "row" and q.groups:
        where = "output rows (the tokens that read them)" if operand == "input" else "output features"
        return f": NaN in {percent(q.zero_groups / q.groups)} of the layer's {where}, and everything computed from them"
    return ""


class ScaleAmaxZero(Rule):
    code = "PCL106"
    name = "scale-amax-zero"
    summary = "A row, column or block of a scaled GEMM's operand has amax 0, and its scale max/amax is infinite: NaN."
    severity = "error"
    precisions = SCALED_MODES
    needs = (ScaledOperands,)
    measured_as = "overflow"
    why = """
Dynamic FP8 and block-scaled recipes compute each scale from the amax of the values it covers:
448/amax for E4M3 per tensor or per row, a power of two per 32-element block (MXFP8), an E4M3 block
scale per 16 (NVFP4). A group that is all zero (a padded token's row, a pruned output feature, a
zeroed block of a sparse weight) has amax 0, and 448/0 is inf; scaling its zeros gives 0 * inf =
NaN, which the GEMM spreads over every output that reads the row. torchao floors amax at 1e-12
(EPS) for this reason; recipes written by hand, older versions and `amax-epsilon = 0` do not.
"""
    example = """
scale = 448.0 / x.abs().amax(dim=-1, keepdim=True)   # a padded row: 448 / 0 = inf
x_fp8 = (x * scale).to(torch.float8_e4m3fn)            # 0 * inf = NaN
"""
    fix = """
Floor amax before dividing (`torch.clamp(amax, min=1e-12)`, torchao's EPS), or keep the layer in
bfloat16; NVFP4 implementations clamp the E4M3 block scale to its smallest normal.
"""
    bad = (Example(_padded_batch, "a padded sequence's zero rows under fp8-rowwise with amax-epsilon = 0",
                   {"precisions": ("fp8-rowwise",), "scaling": {"amax-epsilon": 0}}),)
    good = (Example(_padded_batch, "the same rows with torchao's floor of 1e-12", {"precisions": ("fp8-rowwise",)}),)

    def check_graph(self, ctx):
        for node, record, hit in operands_where(ctx, lambda q: q.zero_groups and q.nonfinite):
            modes = tuple(hit)
            operand, q, recipe = hit[modes[0]]
            groups = GROUP_WORDS[recipe.granularity] if recipe.granularity != "tensor" else "tensor"
            message = (f"{ctx.display(node.name)} computes NaN under {', '.join(modes)}: {q.zero_groups} of the "
                       f"{q.groups} {groups} of its {operand} have amax 0, and the recipe's scale "
                       f"{recipe.element.max_finite:g}/amax is infinite there (amax-epsilon is {recipe.amax_epsilon:g})"
                       f"{_reach(recipe, operand, q)}.")
            fix = (f"Floor amax before the division (torchao's EPS, amax-epsilon = 1e-12), or keep {node.module_path} "
                   "in bfloat16.")
            yield self.finding(node, message, fix=fix, predicted={m: ErrorFigure(None, None) for m in modes},
                               precisions=modes)
