"""PCL203 cancellation."""
from __future__ import annotations

import math

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind
from preclint.reference.analyses.terms import Terms
from preclint.core.numerics import gaussian_max_factor
from preclint.predict.error_model import PREDICTED_ERRORS_NEED, relative_errors
from preclint.rules.base import Example, Rule
from preclint.rules.model._norun import undecided
from preclint.core.tolerances import passing_atol

# A reduction is reported when its terms are this many times larger (RMS) than its result, or when
# this share of its outputs are over 100 times smaller than their terms (a result that is Gaussian
# against its terms, as in ordinary layers, has 0.8% such outputs). Either way its relative error is
# an order of magnitude or more above ordinary rounding, beyond the factor of 3 within which
# preclint's predictions hold (benchmarks/CLAIMS.md), so the excess is not an artefact of the model.
CANCELLATION_LIMIT = 10.0
CANCELLED_SHARE = 0.1
# ... and when that error matters: the op's outputs are the model's, or its rounding (for a sum, with
# that of the values it sums) makes at least this share of the predicted output error. A cancelling
# edge filter early in a network whose error the later layers wash out is no finding.
OUTPUT_SHARE = 0.1


def _sobel(smooth: bool):
    def build():
        import torch

        class EdgeMagnitude(torch.nn.Module):
            """Sobel image gradients of raw pixel values: a difference of nearly equal neighbours."""

            def __init__(self):
                super().__init__()
                self.sobel = torch.nn.Conv2d(1, 2, 3, padding=1, bias=False)
                kx = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]])
                with torch.no_grad():
                    self.sobel.weight.copy_(torch.stack([kx, kx.t()]).unsqueeze(1))

            def forward(self, image):
                return self.sobel(image)

        torch.manual_seed(0)
        if smooth:  # a photo-like image: pixel values around 200 that vary slowly
            ramp = torch.linspace(0, 1, 64)
            image = 200.0 + 20.0 * (ramp[None, :] + ramp[:, None] ** 2) + torch.randn(64, 64) * 0.5
        else:  # texture: neighbouring pixels independent
            image = torch.randn(64, 64) * 50.0
        return EdgeMagnitude(), (image[None, None],)

    return build


class Cancellation(Rule):
    code = "PCL203"
    needs = PREDICTED_ERRORS_NEED
    name = "cancellation"
    summary = "A sum or dot product whose result is small against its terms, so its relative error far exceeds the unit roundoff."
    severity = "warning"
    why = """
Rounding errors of a sum scale with its terms, not with its result: a conv, matmul or sum whose
terms cancel (image gradients of raw pixel values, differences of nearly equal activations, a
row that sums to almost zero) returns a small result carrying the error of the large terms. Its
relative error is the unit roundoff times sqrt(sum of squared terms) / |result|; that ratio is about
1 for ordinary layers and far above 1 here, and every elementwise comparison with an `rtol` fails on
those elements. preclint reads the size of the terms of every output in the reference pass and says
which absolute tolerance the precision can meet.
"""
    example = """
sobel = nn.Conv2d(1, 2, 3, bias=False)      # [-1 0 1] filters on pixel values around 200
edges = sobel(image)                         # terms ~200, results ~1: fp16 error ~0.1 = 10% relative
"""
    fix = """
Remove the common part before the sum (normalize inputs to zero mean, subtract a reference), keep
the layer in float32, or compare its outputs with an absolute tolerance (the message gives one).
"""
    bad = (Example(_sobel(True), "Sobel gradients of a smooth image with pixel values around 200"),)
    good = (Example(_sobel(False), "Sobel gradients of texture, whose neighbouring pixels do not cancel"),)

    def check_graph(self, ctx):
        if not ctx.graph.ran_reference:
            sums = [n for n in ctx.graph.nodes if n.kind in DOT_PRODUCT_KINDS or n.fn in ("sum", "mean", "cumsum")]
            yield from undecided(self, ctx, sums, "cancellation in dot products and sums",
                                 "the size of their terms against their results")
            return
        received = {mode: None for mode in ctx.modes}
        outputs = _output_values(ctx.graph)
        for node in ctx.graph.nodes:
            # the reference pass records the size of the terms of dot products and of sums, means and
            # cumulative sums
            terms = node.record(Terms)
            if terms is None or node.out is None or not node.out.rms or not node.out.finite:
                continue
            if not math.isfinite(terms.rms):  # terms beyond float32 (overflow, PCL101's), not a small result
                continue
            ratio = terms.rms / node.out.rms
            cancelled = terms.condition.get(100, 0.0)
            if ratio < CANCELLATION_LIMIT and cancelled < CANCELLED_SHARE:
                continue
            figures = {}
            for mode in ctx.modes:
                rel = self._relative_error(ctx, node, mode, received, ratio)
                if rel and (outputs is not None and node.name in outputs or self._share(ctx, node, mode) >= OUTPUT_SHARE):
                    figures[mode] = rel
            if figures:
                yield self._finding(ctx, node, ratio, cancelled, figures)

    @staticmethod
    def _share(ctx, node, mode) -> float:
        """The node's share of the predicted output error (a sum's, with the values it sums)."""
        shares = ctx.predictions[mode].contributions
        own = shares.get(node.name, 0.0)
        if node.kind in DOT_PRODUCT_KINDS:
            return own
        return own + sum(shares.get(n, 0.0) for n in node.inputs)

    @staticmethod
    def _relative_error(ctx, node, mode, received, ratio):
        """Relative RMS error of the node's outputs under mode: its own rounding (terms-sized for a dot
        product), plus the relative error its inputs carry, magnified by the cancellation."""
        prediction = ctx.predictions[mode]
        own = prediction.nodes[node.name].local / node.out.rms
        if node.kind in DOT_PRODUCT_KINDS:
            return own
        if received[mode] is None:
            received[mode] = relative_errors(ctx.graph, prediction)
        incoming = max((received[mode].get(n, 0.0) for n in node.inputs), default=0.0)
        return (own**2 + (incoming * ratio) ** 2) ** 0.5

    def _finding(self, ctx, node, ratio, cancelled, figures):
        out = node.out
        mode = max(figures, key=figures.get)
        rel = figures[mode]
        sigma = rel * out.rms  # absolute: the error does not shrink with the result
        predicted = {m: ErrorFigure(r, r * out.rms * gaussian_max_factor(out.numel)) for m, r in figures.items()}
        if cancelled >= CANCELLED_SHARE:
            # elements whose terms are 100x their value carry 100x the relative error of the RMS element
            what = (f"{percent(cancelled)} of its outputs are over 100 times smaller than their terms, so their "
                    f"relative error exceeds {sci(100 * rel / ratio)} under {mode}")
        else:
            what = f"its terms are {sci(ratio)} times larger than its results (RMS), so its relative error is {sci(rel)} under {mode}"
        message = f"{ctx.display(node.name)} cancels: {what}, far above the unit roundoff."
        fix = (f"Compare its outputs with atol >= {sci(passing_atol(sigma, out.numel))} under {mode}: the error is "
               f"absolute, about {sci(sigma)} RMS whatever the value. Or remove the common part before the sum, or "
               "keep the op in float32.")
        return self.finding(node, message, fix=fix, predicted=predicted, precisions=tuple(figures))


def _output_values(graph):
    """Names of the nodes whose values are the model's outputs (through reshapes and the like)."""
    found, frontier = set(), [n for out in graph.output_nodes for n in out.inputs]
    while frontier:
        name = frontier.pop()
        node = graph.get(name)
        if node is None or name in found:
            continue
        found.add(name)
        if node.kind == Kind.SHAPE:
            frontier.extend(node.inputs)
    return found
