"""PCL107 outlier-crushed-scale: one massive activation channel sets a per-tensor (or per-row) FP8
scale, and the other values underflow."""
from __future__ import annotations

from preclint.core.findings import percent, sci
from preclint.core.numerics import MODES, SCALED_MODES
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.rules.base import Example, Rule
from preclint.rules.model._scaled import dominant_channel, scaled_layers

# The fraction of an operand's nonzero values that may underflow to zero: Transformer Engine's
# AutoswitchGemm moves a GEMM to high precision above 5% (underflow_threshold_pct, research/peers-3.md 1.2).
UNDERFLOW_LIMIT = 0.05
# A channel whose amax exceeds the 90th percentile of the channels' amax this many times is one the
# scale is set by (massive activations of trained LLMs are 10^3 to 10^4 times the typical channel).
DOMINANCE = 100.0


def _massive_channel(scale: float):
    def build():
        import torch

        class Block(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.up, self.down = torch.nn.Linear(64, 128), torch.nn.Linear(128, 64)

            def forward(self, x):
                return x + self.down(torch.relu(self.up(x)))

        torch.manual_seed(0)
        x = torch.randn(2, 16, 64) * 0.05
        x[..., 3] = scale  # one residual channel far above the others (a massive activation)
        return Block().eval(), (x,)

    return build


class OutlierCrushedScale(Rule):
    code = "PCL107"
    name = "outlier-crushed-scale"
    summary = "One massive activation channel sets an FP8 per-tensor or per-row scale, and the other values underflow."
    severity = "warning"
    precisions = SCALED_MODES
    needs = (ScaledOperands,)
    measured_as = "local"
    why = """
A tensorwise FP8 scale maps the tensor's amax to 448; everything below amax * 2^-9 / 448 becomes 0
and everything below amax * 2^-6 / 448 keeps fewer than E4M3's 3 mantissa bits. Trained transformers
carry a few "massive activation" channels 10^3-10^4 times the others, so one channel sets the scale
and the rest of the residual stream underflows. Per-row (per-token) scales do not help: the channel is
in every row. Per-block scales (MXFP8, NVFP4) confine the damage to the blocks that hold the channel.
"""
    example = """
h = self.norm(x)           # channel 3 reaches 3000, the others ~0.05
y = self.up(h)             # fp8 tensorwise: 0.05 * 448 / 3000 < 2^-9: the others become 0
"""
    fix = """
Use a per-block recipe (mxfp8) or keep the layer in bfloat16; smoothing the channel into the weight
(SmoothQuant-style per-channel rescaling) also works.
"""
    bad = (Example(_massive_channel(3000.0), "a residual channel at 3000 beside values of 0.05", {"precisions": ("fp8",)}),)
    good = (Example(_massive_channel(0.2), "the same channel at 0.2", {"precisions": ("fp8",)}),)

    def check_graph(self, ctx):
        for node, record in scaled_layers(ctx):
            channel, dominance = dominant_channel(record)
            if dominance < DOMINANCE:
                continue
            modes = [m for m in ctx.modes if MODES[m].recipe.granularity in ("tensor", "row")
                     and m not in record.rejected and not MODES[m].recipe.keeps(node.module_path)
                     and record.modes[m]["input"].underflow >= UNDERFLOW_LIMIT]
            if not modes:
                continue
            q = record.modes[modes[0]]["input"]
            # which scaling keeps the other values: the per-block recipe of the same elements (not a
            # narrower format) losing fewest to 0 and subnormals
            element = MODES[modes[0]].recipe.element
            lost = {m: record.modes[m]["input"].underflow + record.modes[m]["input"].subnormal for m in record.modes
                    if MODES[m].recipe.granularity == "block" and MODES[m].recipe.element == element
                    and m not in record.rejected}
            better = min(lost, key=lost.get) if lost else None
            if better is not None and lost[better] >= (q.underflow + q.subnormal) / 2:
                better = None
            keeps = (f"; {better} (blocks of {MODES[better].recipe.block}) loses {percent(lost[better])}"
                     if better is not None else f"; no per-block {element.name.upper()} recipe keeps them")
            message = (f"{ctx.display(node.name)}'s input has one channel ({channel}) reaching "
                       f"{sci(record.channel_absmax[channel])}, {dominance:.0f}x the other channels' (90th percentile of their amax): under "
                       f"{', '.join(modes)} its scale underflows {percent(q.underflow)} of the other values to 0 and "
                       f"leaves {percent(q.subnormal)} among E4M3's subnormals{keeps}.")
            fix = (f"Run {node.module_path} under {better}, or keep it in bfloat16 (scaling keep)." if better else
                   f"Keep {node.module_path} in bfloat16 (scaling keep), or move the channel's scale into the weight "
                   "(SmoothQuant-style); rowwise scales keep the channel in every row.")
            yield self.finding(node, message, fix=fix, predicted={m: ctx.node_figure(node, m) for m in modes},
                               precisions=tuple(modes))
