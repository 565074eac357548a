"""PCL110 e4m3-range: a tensor whose spread of magnitudes E4M3 cannot hold under one scale, and E5M2 can."""
from __future__ import annotations

from preclint.core.findings import percent
from preclint.core.numerics import MODES
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.rules.base import Example, Rule
from preclint.rules.model._scaled import dominant_channel, scaled_layers
from preclint.rules.model.outlier_crushed_scale import DOMINANCE, UNDERFLOW_LIMIT


def _spread_channels(octaves: float):
    def build():
        """Channels whose scales spread over ``octaves`` octaves, each compensated by the weight column
        that reads it (a norm's small gains before a layer with large weights there): every channel
        adds as much to the product, the small ones too."""
        import torch

        torch.manual_seed(0)
        gains = torch.exp2(-torch.linspace(0, octaves, 64))
        layer = torch.nn.Linear(64, 64)
        with torch.no_grad():
            layer.weight.div_(gains)
        return torch.nn.Sequential(layer).eval(), (torch.randn(32, 64) * gains,)

    return build


class E4m3Range(Rule):
    code = "PCL110"
    name = "e4m3-range"
    summary = "A linear layer's input spans more octaves than E4M3 holds under one scale; E5M2 keeps them."
    severity = "warning"
    precisions = ("fp8",)
    needs = (ScaledOperands,)
    measured_as = "local"
    why = """
One scale maps a tensor's amax to E4M3's 448; E4M3 then resolves values down to 2^-9, 17.8 octaves
below 448, and rounds the rest to 0. E5M2 gives up one mantissa bit for 14 more octaves (57344 down
to 2^-16). A tensor whose magnitudes spread wider than E4M3's range without one dominant channel
(heavy-tailed values, the reason Transformer Engine's HYBRID recipe uses E5M2 for gradients) loses
its small values in E4M3 and keeps them in E5M2.
"""
    example = """
h = self.norm(x)     # gains from 1 down to 2^-24 across channels
y = self.proj(h)     # its weights undo the gains: every channel counts, E4M3 zeroes the small ones
"""
    fix = """
Use E5M2 for this tensor (the `format = "e5m2"` scaling option; TE's HYBRID recipe), per-block
scales (mxfp8), or keep the layer in bfloat16.
"""
    bad = (Example(_spread_channels(24.0), "channels over 24 octaves, each as important", {"precisions": ("fp8",)}),)
    good = (Example(_spread_channels(6.0), "channels over 6 octaves", {"precisions": ("fp8",)}),)

    def check_graph(self, ctx):
        if "fp8" not in ctx.modes or MODES["fp8"].recipe.element.name != "e4m3":
            return
        for node, record in scaled_layers(ctx):
            if "fp8" in record.rejected or MODES["fp8"].recipe.keeps(node.module_path) or record.input_e5m2 is None:
                continue
            e4m3, e5m2 = record.modes["fp8"]["input"], record.input_e5m2
            dominated = dominant_channel(record)[1] >= DOMINANCE
            if dominated or e4m3.underflow < UNDERFLOW_LIMIT or e5m2.underflow > e4m3.underflow / 2 \
                    or e5m2.dot_error >= e4m3.dot_error:
                continue  # one channel sets the scale (PCL107), or E5M2 keeps no more
            message = (f"{ctx.display(node.name)}'s input spreads wider than E4M3 holds under one scale: fp8 "
                       f"underflows {percent(e4m3.underflow)} of its values to 0, and its products err by "
                       f"{percent(e4m3.dot_error)} of their terms; E5M2 underflows {percent(e5m2.underflow)}, an "
                       f"error of {percent(e5m2.dot_error)}.")
            fix = f'Use E5M2 for {node.module_path} (scaling format = "e5m2"), per-block scales, or bfloat16.'
            yield self.finding(node, message, fix=fix, predicted={"fp8": ctx.node_figure(node, "fp8")}, precisions=("fp8",))
