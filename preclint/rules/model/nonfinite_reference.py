"""PCL002 nonfinite-reference: the float32 reference run is already inf or NaN."""
from __future__ import annotations

from preclint.core.findings import ErrorFigure
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.rules.base import Example, Rule


def _small_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)), (torch.randn(4, 64),)


def _overflowing_reference():
    import torch

    class Exploding(torch.nn.Module):
        def forward(self, x):
            return torch.exp(x * 100.0)

    return Exploding(), (torch.full((2, 4), 10.0),)


def _log_buckets(dropped: bool):
    def build():
        import torch

        class RelativePositionBias(torch.nn.Module):
            """Buckets of relative distances as T5 computes them: log of every distance, 0 included
            (-inf), cast to integers; ``torch.where`` keeps the exact bucket of small distances."""

            def __init__(self):
                super().__init__()
                self.bias = torch.nn.Embedding(16, 1)

            def forward(self, x):
                positions = torch.arange(x.shape[-1])
                distance = (positions[None, :] - positions[:, None]).abs()
                large = 4 + (torch.log(distance.float() / 4) * 4).to(torch.long)  # log(0) = -inf
                buckets = torch.where(distance < 4, distance, large) if dropped else large
                return x + self.bias(buckets.clamp(0, 15)).squeeze(-1)

        torch.manual_seed(0)
        return RelativePositionBias(), (torch.randn(2, 16, 16),)

    return build


class NonfiniteReference(Rule):
    code = "PCL002"
    needs = PREDICTED_ERRORS_NEED
    measured_as = "reference"
    name = "nonfinite-reference"
    summary = "The model produces inf or NaN already in fp32 on the example inputs."
    severity = "error"
    why = """
Precision findings compare reduced precision against an fp32 reference. When the reference itself
is inf or NaN, there is nothing to compare against: the model (or its example inputs) is broken
before precision matters.
"""
    example = """
def forward(self, x):
    return torch.exp(x * 100.0)   # inf in fp32 for x > 0.89
"""
    fix = "Fix the model or its example inputs so that the fp32 run is finite, then run preclint again."
    bad = (Example(_overflowing_reference, "exp overflows fp32"),
           Example(_log_buckets(False), "log(0) cast to an integer bucket that the output reads"))
    good = (Example(_small_mlp, "a finite model"),
            Example(_log_buckets(True), "log(0) at elements that torch.where discards"))

    def check_graph(self, ctx):
        name = ctx.graph.first_nonfinite
        if not name:
            return
        node = ctx.graph[name]
        yield self.finding(
            node,
            f"{ctx.display(name)} is inf or NaN already in the fp32 reference run; precision errors downstream of "
            "it cannot be predicted.",
            predicted={mode: ErrorFigure(None, None) for mode in ctx.modes},
            precisions=ctx.modes,
        )
