"""PCL003 nondeterministic-forward: the model does not give the same output twice on the same inputs."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure, sci
from preclint.rules.base import Example, Rule


def _noisy():
    """Noise added in forward from the global generator: each call draws new numbers."""
    import torch

    class Noisy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(x) + 1e-3 * torch.randn_like(x)

    torch.manual_seed(0)
    return Noisy().eval(), (torch.randn(4, 16),)


def _dropout_left_on():
    """``F.dropout(training=True)``: dropout whatever mode the module is in."""
    import torch
    import torch.nn.functional as F

    class DropoutOn(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(16, 16)

        def forward(self, x):
            return self.fc(F.dropout(x, 0.1, training=True))

    torch.manual_seed(0)
    return DropoutOn().eval(), (torch.randn(4, 16),)


def _mlp_in_eval():
    """nn.Dropout in eval mode: the same output every call."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 8))
    return model.eval(), (torch.randn(4, 16),)


class NondeterministicForward(Rule):
    code = "PCL003"
    needs = ()
    name = "nondeterministic-forward"
    summary = "The model does not give the same output twice on the same inputs, so part of every measured error is its own noise."
    severity = "warning"
    needs_probe = True
    measured_as = "output"
    why = """
The probe measures precision error as the difference between a precision's run and a float64 run
on the same inputs. A forward that draws random numbers the probe does not control (noise added in
forward, `F.dropout(training=True)`, a generator of its own, a counter that changes between calls)
differs from itself by that noise, in float64 as in float16: the difference is not precision error,
and no precision, plan or tolerance removes it. The probe runs the float64 reference twice; where
the two runs differ, the run-to-run difference is the floor below which measured errors tell
nothing, and findings measured within a few times it are not confirmed by them.
"""
    example = """
def forward(self, x):
    return self.fc(x) + 0.01 * torch.randn_like(x)   # a new draw every call
"""
    fix = """
Make the forward deterministic for the check: dropout off (`model.eval()`, `F.dropout(...,
training=self.training)`), noise drawn from a generator the caller seeds and passes in, state reset
between calls. Where the noise is the model's purpose, compare against a tolerance above the
run-to-run figure this finding gives.
"""
    # Run by the probe's tests (tests/probe/test_probe_cli.py): plain checks never fire this rule.
    probe_bad = (
        Example(_noisy, "noise from randn_like added in forward", {"precisions": ("bf16",)}),
        Example(_dropout_left_on, "dropout with training=True in forward", {"precisions": ("fp16",)}),
    )
    probe_good = (
        Example(_mlp_in_eval, "nn.Dropout in eval mode", {"precisions": ("bf16",)}),
    )

    def check_probe(self, ctx, result, flagged):
        floor = result.noise_floor
        if floor is None:
            return
        figure = sci(floor) if floor != float("inf") else "more than its own size (shapes or integer outputs differ)"
        message = (f"{ctx.graph.model_name} is not deterministic: a second float64 run on the same inputs differs from "
                   f"the first by relative RMS {figure} at the output; measured errors below {result.noise_margin:g}x "
                   "that are its own noise, not precision error.")
        finding = self.finding(None, message, precisions=ctx.modes)
        finding.measured = {mode: ErrorFigure(rel_error=floor) for mode in ctx.modes}
        finding.status = "confirmed"
        yield finding
