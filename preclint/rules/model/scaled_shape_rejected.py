"""PCL108 scaled-shape-rejected: a linear layer whose shape the scaled GEMM kernels reject."""
from __future__ import annotations

from preclint.core.findings import percent
from preclint.core.numerics import MODES, SCALED_MODES
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.rules.base import Example, Rule
from preclint.predict.flops import flop_shares
from preclint.rules.model._scaled import scaled_layers

# A rejected layer doing less than this share of the linear layers' multiply-adds is left unsaid: it
# changes neither the speed-up nor the error
MIN_SHARE = 0.01


def _classifier(classes: int):
    def build():
        import torch

        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, classes))
        return model.eval(), (torch.randn(32, 64),)

    return build


class ScaledShapeRejected(Rule):
    code = "PCL108"
    name = "scaled-shape-rejected"
    summary = "A linear layer's shape is one the FP8/MX/NVFP4 kernels reject: it stays in bfloat16, or fails."
    severity = "info"
    precisions = SCALED_MODES
    needs = (ScaledOperands,)
    measured_as = "local"
    why = """
`torch._scaled_mm` needs the reduction K and the output features N to be multiples of 16, and
block-scaled formats need K to be a whole number of blocks (32 for MXFP8, 16 for NVFP4). torchao's
`convert_to_float8_training` converts every nn.Linear its `module_filter_fn` lets through, and a
converted layer of another shape raises at its first call; a filter that skips it leaves it in
bfloat16, which the speed-up and the error budget should count.
"""
    example = """
self.head = nn.Linear(768, 1000)   # 1000 is a multiple of 8, not 16: _scaled_mm raises
"""
    fix = """
Skip the layer in the conversion (`module_filter_fn`, the `keep` scaling option) or pad its features
to a multiple of 16 (torchao's `pad_inner_dim` pads K).
"""
    bad = (Example(_classifier(1000), "a 1000-class head: 1000 is no multiple of 16", {"precisions": ("fp8",)}),)
    good = (Example(_classifier(1024), "the same head padded to 1024 classes", {"precisions": ("fp8",)}),)

    def check_graph(self, ctx):
        shares = flop_shares(ctx.graph)
        linear_total = sum(shares.get(n.name, 0.0) for n, _ in scaled_layers(ctx)) or 1.0
        for node, record in scaled_layers(ctx):
            modes = tuple(m for m in ctx.modes if m in record.rejected and not MODES[m].recipe.keeps(node.module_path))
            share = shares.get(node.name, 0.0) / linear_total
            if not modes or share < MIN_SHARE:
                continue
            reasons = {record.rejected[m] for m in modes}
            message = (f"{ctx.display(node.name)} cannot run as a scaled GEMM under {', '.join(modes)}: "
                       f"{'; '.join(sorted(reasons))}; it does {percent(share)} of the linear layers' multiply-adds.")
            fix = (f"Leave {node.module_path} out of the conversion (torchao's module_filter_fn, scaling keep = "
                   f"[\"{node.module_path}\"]), or pad its features to a multiple of 16.")
            yield self.finding(node, message, fix=fix, predicted={m: ctx.node_figure(node, m) for m in modes},
                               precisions=modes)
