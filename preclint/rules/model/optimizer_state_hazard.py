"""PCL603 optimizer-state-hazard: an optimizer eps or state the state's dtype cannot hold."""
from __future__ import annotations

from preclint.rules.base import Example, Rule
from preclint.rules.model._training import STEP_PRECISIONS, regression


class OptimizerStateHazard(Rule):
    code = "PCL603"
    name = "optimizer-state-hazard"
    summary = "The optimizer's eps or state rounds to 0, to a subnormal, or overflows in the dtype it is kept in."
    severity = "warning"
    precisions = STEP_PRECISIONS
    needs = ()
    measured_as = "training"
    why = """
Optimizers keep their state in the parameters' dtype. With `model.half()`, Adam's `eps=1e-8` is 0 in
float16 (below 3e-8), and a second moment `(1 - beta2) * g^2` under 3e-8 (any gradient under 5e-6)
stores 0: the update `m / (sqrt(v) + eps)` divides by zero and the weight becomes inf or NaN. A second
moment above 65504 (gradients above 8000) overflows. preclint reads eps from the optimizer's
hyperparameters and the state's ranges from a float64 step, and says which elements are lost. FP8 and
NVFP4 training recipes keep the state in float32, as autocast does; it is judged there the same way.
"""
    example = """
model = Net().half()
opt = torch.optim.Adam(model.parameters(), eps=1e-8)   # eps is 0 in float16
"""
    fix = """
Keep the optimizer state in float32 (autocast with float32 master weights, or an optimizer with float32
state); if it must be float16, use an eps float16 holds as a normal number (1e-4 or more).
"""
    bad = (Example(regression(precision_loss=1.0, optimizer="adam", lr=1e-3, dtype="float16"),
                   "model.half() with Adam (eps=1e-8)", {"precisions": ("fp16-full",)}),)
    good = (Example(regression(precision_loss=1.0, optimizer="adam", lr=1e-3), "fp16 autocast with Adam's float32 state",
                    {"precisions": ("fp16",)}),)

    def check_graph(self, ctx):
        for mode in (m for m in ctx.training if m in self.precisions):  # a half model trains as written: fp16-full
            figures = ctx.training[mode]
            if figures is None:
                continue
            rows = [(p, h) for p in figures.parameters for h in p.hazards]
            if not figures.hazards and not rows:
                continue
            said = list(figures.hazards) + [f"{p.parameter} {h}" for p, h in rows[:3]]
            more = f" (and {len(rows) - 3} more)" if len(rows) > 3 else ""
            finding = self.finding(None, f"under {mode}: " + "; ".join(said) + more + ".", precisions=(mode,),
                                   severity="error" if figures.nonfinite_updates else None)
            finding.module = rows[0][0].module if rows else ""
            yield finding
