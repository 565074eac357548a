"""PCL111 scale-floor-flushes: the recipe's amax floor (amax-epsilon) is above a scaled GEMM operand's
amax, so the floor sets the scale and the operand's values become 0."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.numerics import SCALED_MODES
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.rules.base import Example, Rule
from preclint.rules.model._scaled import GROUP_WORDS, operands_where
from preclint.rules.model.outlier_crushed_scale import UNDERFLOW_LIMIT


def _mlp():
    import torch

    torch.manual_seed(0)
    return (torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64)).eval(),
            (torch.randn(16, 64),))


class ScaleFloorFlushes(Rule):
    code = "PCL111"
    name = "scale-floor-flushes"
    summary = ("The recipe's amax floor (amax-epsilon) is above a scaled GEMM operand's amax: the floor sets the "
               "scale and the values become 0.")
    severity = "error"
    precisions = SCALED_MODES
    needs = (ScaledOperands,)
    measured_as = "local"
    why = """
A dynamic scale is max/amax; the recipe floors amax (`amax-epsilon`, torchao's EPS of 1e-12) only
so that an all-zero group does not divide by zero. A floor above a group's amax is no longer a
guard: the floor sets the scale, max/epsilon, the group's values are scaled far below the element
format's smallest subnormal and become 0, and the GEMM computes zeros (or keeps a fraction of its
terms). With E4M3 a value becomes 0 below amax-epsilon x 2^-10 / 448: a floor of 1e30 zeroes every
GEMM of a model, one of 1e-3 the operands whose values are below 2e-9.
"""
    example = """
scale = 448.0 / torch.clamp(x.abs().amax(), min=1e30)   # amax 3.2, floored to 1e30
x_fp8 = (x * scale).to(torch.float8_e4m3fn)              # every value below 2^-9: all 0
"""
    fix = """
Keep amax-epsilon far below the amax of every operand (torchao's 1e-12); it guards all-zero groups,
nothing else.
"""
    bad = (Example(_mlp, "an MLP under fp8 with amax-epsilon = 1e30", {"precisions": ("fp8",),
                                                                        "scaling": {"amax-epsilon": 1e30}}),)
    good = (Example(_mlp, "the same MLP with torchao's floor of 1e-12", {"precisions": ("fp8",)}),)

    def check_graph(self, ctx):
        for node, record, hit in operands_where(ctx, lambda q: q.floored_groups and q.underflow >= UNDERFLOW_LIMIT):
            modes = tuple(hit)
            operand, q, recipe = hit[modes[0]]
            groups = "tensor" if recipe.granularity == "tensor" else f"{q.groups} {GROUP_WORDS[recipe.granularity]}"
            of = "the" if recipe.granularity == "tensor" else f"{q.floored_groups} of the"
            message = (f"{ctx.display(node.name)} loses {percent(q.underflow)} of its {operand}'s nonzero values to 0 "
                       f"under {', '.join(modes)}: amax-epsilon {sci(recipe.amax_epsilon)} is above the amax of {of} "
                       f"{groups} (amax {sci(q.amax)}), so the floor, not the values, sets the scale.")
            fix = (f"Set amax-epsilon far below the operands' amax (torchao's 1e-12), or keep {ctx.display(node.name)} "
                   "in bfloat16.")
            yield self.finding(node, message, fix=fix, predicted={m: ErrorFigure(None, None) for m in modes},
                               precisions=modes)
