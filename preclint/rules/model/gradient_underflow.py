"""PCL601 gradient-underflow: gradients the precision stores as 0 at the step's loss scale."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, percent
from preclint.rules.base import Example, Rule
from preclint.predict.ordinary import STEP_SHARE
from preclint.rules.model._training import (STEP_PRECISIONS, classifier, module_of_worst, regression, scaled_cause,
                                            scaled_fix, worst)


class GradientUnderflow(Rule):
    code = "PCL601"
    name = "gradient-underflow"
    summary = "A training step's gradients fall below the format's smallest subnormal at the loss scale, and flush to 0."
    severity = "warning"
    precisions = STEP_PRECISIONS
    needs = ()
    measured_as = "training"
    training_figure = "underflow_fraction"
    why = """
float16 stores nothing below 6e-8 (its smallest subnormal; half of it rounds to 0). A loss averaged over
a large batch, a small loss weight, or small targets give gradients of 1e-9 and less: under fp16 autocast
the gradients of the activations and of the weights that linear layers and convolutions compute in
float16 become exactly 0, and the weights they belong to stop learning. A GradScaler multiplies the
loss (by 65536 to start with) so that the gradients land inside float16's range, and divides them
back in float32. preclint predicts, from one float64 step, the fraction of each parameter's gradient
elements that flush at the step's loss scale, and the window of loss scales that keeps them (the
figure `scale_window` in the JSON report).

Under an FP8 or NVFP4 training recipe (`fp8`, `fp8-rowwise`, `mxfp8`, `nvfp4`) there is no loss scale to
raise: each converted linear layer scales its output gradient by its own amax (per tensor, row or
block) before rounding it to E5M2, E4M3 or E2M1, and what lies further below the amax than the element
format spans becomes 0. The layers before it receive those zeros, and weight gradients made only of them
flush: preclint counts them over the whole model, from the float64 step with the recipe's flushes applied,
and names the layer whose output gradient the recipe flushes most (PCL605 reports that layer itself).
"""
    example = """
with torch.autocast("cuda", dtype=torch.float16):
    loss = F.mse_loss(model(x), y)
loss.backward()      # no GradScaler: gradients under 6e-8 are 0
"""
    fix = """
Scale the loss with `torch.amp.GradScaler` (or raise its `init_scale` into the predicted window), or
train in bfloat16, whose range is float32's. Scaling the loss itself (a sum instead of a mean) helps too.
Under a scaled recipe, keep the layer whose output gradient flushes in bfloat16 (`--scaling keep=PATH`;
torchao's `module_filter_fn`, or outside Transformer Engine's autocast): usually the output head.
"""
    bad = (Example(regression(), "fp16 autocast, gradients near 1e-9, no GradScaler", {"precisions": ("fp16",)}),
           Example(classifier(temperature=0.01), "a classifier whose loss divides its logits by 0.01, under fp8: "
                   "E5M2 gradients flush the wrong classes", {"precisions": ("fp8",)}))
    good = (Example(regression(scaler=True), "the same step with a GradScaler", {"precisions": ("fp16",)}),
            Example(regression(), "the same step in bf16 autocast", {"precisions": ("bf16",)}),
            Example(classifier(), "a classifier at temperature 1 under fp8", {"precisions": ("fp8",)}),
            Example(classifier(temperature=0.01), "a classifier at temperature 0.01 under fp8, its head kept in "
                    "bfloat16", {"precisions": ("fp8",), "scaling": {"keep": ["4"]}}))

    def check_graph(self, ctx):
        for mode in (m for m in ctx.training if m in self.precisions):  # a half model trains as written: fp16-full
            figures = ctx.training[mode]
            if figures is None or figures.underflow_fraction <= STEP_SHARE:
                continue
            names = worst(figures.parameters, "underflow_fraction")
            if figures.scaled:
                yield self._scaled(mode, figures, names)
                continue
            window = figures.scale_window
            scale = f"at loss scale {figures.loss_scale:g}" + \
                (f"; scales {window[0]:g} to {window[1]:g} keep 99% of them" if window and window[0] and window[1]
                 and window[0] <= window[1] else "")
            finding = self.finding(
                None, f"{percent(figures.underflow_fraction)} of the gradient elements flush to 0 under {mode} "
                f"{scale} (most: {', '.join(names)}).",
                predicted={mode: ErrorFigure(figures.grad_rel_error, None)}, precisions=(mode,))
            finding.module = module_of_worst(figures.parameters, "underflow_fraction")
            yield finding

    def _scaled(self, mode, figures, names):
        cause = scaled_cause(figures)
        how = (f": the recipe's {cause[2]} gradient scales flush {percent(cause[1])} of the output gradient of "
               f"{cause[0] or 'the model'}" if cause else "")
        finding = self.finding(
            None, f"{percent(figures.underflow_fraction)} of the gradient elements flush to 0 under {mode}{how} "
            f"(most: {', '.join(names)}).", fix=scaled_fix(cause),
            predicted={mode: ErrorFigure(figures.grad_rel_error, None)}, precisions=(mode,))
        finding.module = module_of_worst(figures.parameters, "underflow_fraction")
        return finding
