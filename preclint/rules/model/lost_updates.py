"""PCL602 lost-updates: weight updates the storage format rounds away."""
from __future__ import annotations

from preclint.core.findings import percent
from preclint.rules.base import Example, Rule
from preclint.predict.ordinary import STEP_SHARE
from preclint.rules.model._training import (STEP_PRECISIONS, classifier, module_of_worst, regression, scaled_cause,
                                            scaled_fix, worst)


class LostUpdates(Rule):
    code = "PCL602"
    name = "lost-updates"
    summary = "A training step leaves weights unchanged that a float64 step moves: updates under half a spacing of the weight."
    severity = "warning"
    precisions = STEP_PRECISIONS
    needs = ()
    measured_as = "training"
    training_figure = "lost_update_fraction"
    why = """
An update changes a weight only if it is at least half the spacing of the weight's format at that weight:
bfloat16 keeps 8 significant bits, so a weight of 1.0 ignores any update under 0.0039, and SGD at
lr 1e-4 with gradients of order 1 changes almost nothing in a pure-bf16 model (`model.bfloat16()`). A
gradient that flushed to 0 loses its update too. float32 master weights (autocast) keep 24 bits and
lose only updates a float32 step loses too. preclint counts, per parameter, the weights a float64 step
moves that the precision leaves where they were, beyond what float32 storage alone loses.

FP8 and NVFP4 training recipes keep float32 master weights, so what they lose is the updates of gradients
their scaled GEMMs flush: a weight gradient element that is 0 moves nothing, under SGD and under Adam's
first step alike. The count comes from the float64 step with the recipe's flushes applied (PCL601 counts
the flushed gradients themselves; some flush only partly and still lose their update under SGD).
"""
    example = """
model = Net().bfloat16()
opt = torch.optim.SGD(model.parameters(), lr=1e-4)   # most updates < half a bf16 spacing
"""
    fix = """
Keep float32 master weights (train under autocast, or keep a float32 copy the optimizer updates), or
use Kahan-compensated or stochastic-rounding updates for low-precision weights; a larger learning rate
moves more weights. Under a scaled recipe, keep the layer whose output gradient flushes in bfloat16
(`--scaling keep=PATH`).
"""
    bad = (Example(regression(precision_loss=1.0, lr=1e-4, dtype="bfloat16"), "pure-bf16 SGD at lr 1e-4",
                   {"precisions": ("bf16-full",)}),
           Example(classifier(temperature=0.01), "a classifier at temperature 0.01 under fp8-rowwise: the "
                   "weight gradients of the flushed wrong classes move nothing", {"precisions": ("fp8-rowwise",)}))
    good = (Example(regression(precision_loss=1.0, lr=1e-4), "bf16 autocast with float32 master weights",
                    {"precisions": ("bf16",)}),
            Example(regression(precision_loss=1.0, lr=1e-3, optimizer="adam"), "fp16 autocast with Adam",
                    {"precisions": ("fp16",)}),
            Example(classifier(), "a classifier at temperature 1 under fp8-rowwise", {"precisions": ("fp8-rowwise",)}),
            Example(classifier(temperature=0.01), "the temperature-0.01 classifier under mxfp8, whose E8M0 block "
                    "scales flush its head's gradient but few weight gradients: 0.4% more updates lost than float32's",
                    {"precisions": ("mxfp8",)}))

    def check_graph(self, ctx):
        for mode in (m for m in ctx.training if m in self.precisions):  # a half model trains as written: fp16-full
            figures = ctx.training[mode]
            if figures is None:
                continue
            excess = figures.lost_update_fraction - (figures.float32_lost_update_fraction or 0.0)
            if excess <= STEP_SHARE:
                continue
            names = worst(figures.parameters, "lost_update_fraction")
            cause = scaled_cause(figures) if figures.scaled else None
            how = (f"; the recipe's {cause[2]} gradient scales flush {percent(cause[1])} of the output gradient of "
                   f"{cause[0] or 'the model'}" if cause else "")
            finding = self.finding(
                None, f"{percent(figures.lost_update_fraction)} of the weight updates are lost under {mode} "
                f"(float32 storage would lose {percent(figures.float32_lost_update_fraction or 0.0)}{how}; most: "
                f"{', '.join(names)}).", fix=scaled_fix(cause) if figures.scaled else None, precisions=(mode,))
            finding.module = module_of_worst(figures.parameters, "lost_update_fraction")
            yield finding
