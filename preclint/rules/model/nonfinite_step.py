"""PCL604 nonfinite-step: a training step that makes a weight inf or NaN."""
from __future__ import annotations

from preclint.rules.base import Example, Rule
from preclint.rules.model._training import STEP_PRECISIONS, module_of_worst, regression


class NonfiniteStep(Rule):
    code = "PCL604"
    name = "nonfinite-step"
    summary = "A training step makes weights inf or NaN: a gradient that overflows, or an update that divides by 0."
    severity = "error"
    precisions = STEP_PRECISIONS
    needs = ()
    measured_as = "training"
    training_figure = "nonfinite_updates"
    why = """
One inf or NaN in a weight spreads through every later step: the loss turns NaN and the run is lost.
Without a GradScaler nothing skips such a step. The causes preclint predicts from one float64 step: a
gradient above float16's 65504 (a large loss, a loss summed over many elements), and an Adam-family
update that divides by a second moment and an eps that both store 0 in float16. It names the first
module whose output's gradient is not finite. Under an FP8 or NVFP4 training recipe the same figure is
judged: the scaled GEMMs saturate rather than overflow, so a non-finite weight there comes from the
bfloat16 rest of the step or the loss.
"""
    example = """
model = Net().half()
opt = torch.optim.Adam(model.parameters())   # m / (sqrt(0) + 0) where the second moment flushes
"""
    fix = """
Keep float32 master weights and optimizer state (autocast) with a GradScaler, which skips a step whose
gradients are not finite and lowers its scale; or reduce the loss (a mean, not a sum) so that its
gradients stay below 65504.
"""
    bad = (Example(regression(precision_loss=1.0, optimizer="adam", lr=1e-3, dtype="float16"),
                   "model.half() with Adam", {"precisions": ("fp16-full",)}),)
    good = (Example(regression(precision_loss=1.0, optimizer="adam", lr=1e-3, scaler=True),
                    "fp16 autocast with a GradScaler and float32 Adam", {"precisions": ("fp16",)}),)

    def check_graph(self, ctx):
        for mode in (m for m in ctx.training if m in self.precisions):  # a half model trains as written: fp16-full
            figures = ctx.training[mode]
            if figures is None or not figures.nonfinite_updates:
                continue
            names = [p.parameter for p in sorted(figures.parameters, key=lambda p: -p.nonfinite_updates)
                     if p.nonfinite_updates][:3]
            where = f"; the first inf/NaN gradient is at the output of {figures.first_nonfinite_backward or 'the model'}" \
                if figures.first_nonfinite_backward is not None else ""
            finding = self.finding(
                None, f"{figures.nonfinite_updates} weights become inf or NaN in one {mode} step "
                f"({', '.join(names)}){where}.", precisions=(mode,))
            finding.module = module_of_worst(figures.parameters, "nonfinite_updates")
            yield finding

