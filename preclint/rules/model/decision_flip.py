"""PCL301 decision-flip."""
from __future__ import annotations

import math

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.ir import Kind
from preclint.core.numerics import MODES
from preclint.reference.analyses.margins import DecisionMargins, deciding_input
from preclint.reference.analyses.rounded_ties import RoundedTies, rounding_made_ties
from preclint.predict.error_model import PREDICTED_ERRORS_NEED, ties
from preclint.predict.routing import routers
from preclint.rules.base import Example, Rule

# A decision is reported when, under some mode, at least this fraction of its units (rows for argmax,
# elements for a threshold) is expected to flip, or at least one flip is more likely than not.
MIN_FLIP_FRACTION = 0.01
MIN_EXPECTED_FLIPS = 0.5


def _offset_logits_classifier():
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(256, 256)
            self.head = torch.nn.Linear(256, 10)

        def forward(self, x):
            return self.head(torch.relu(self.body(x))).argmax(dim=-1)

    torch.manual_seed(0)
    model = Classifier()
    with torch.no_grad():
        model.head.bias.fill_(64.0)  # a common offset: gaps of ~0.1 between logits near 64
    return model, (torch.randn(64, 256),)


def _confident_classifier():
    import torch

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.head = torch.nn.Linear(16, 4)

        def forward(self, x):
            return self.head(x).argmax(dim=-1)

    torch.manual_seed(0)
    model = Classifier()
    with torch.no_grad():
        model.head.weight.copy_(torch.eye(4, 16) * 10)
        model.head.bias.zero_()
    x = torch.zeros(8, 16)
    x[torch.arange(8), torch.arange(8) % 4] = 5.0  # one class far ahead in every row
    return model, (x,)


def _near_uniform_scores():
    import torch

    class Scorer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.body = torch.nn.Linear(256, 256)
            self.cls = torch.nn.Linear(256, 91)

        def forward(self, x):
            return self.cls(torch.relu(self.body(x))).softmax(dim=-1).topk(5, dim=-1).indices

    torch.manual_seed(0)
    model = Scorer()
    with torch.no_grad():  # a detector's class head at random init: near-uniform scores
        model.cls.weight.mul_(1e-4)
        model.cls.bias.mul_(1e-4)
    return model, (torch.randn(256, 256),)


class DecisionFlip(Rule):
    code = "PCL301"
    needs = PREDICTED_ERRORS_NEED
    measured_as = "flips"
    name = "decision-flip"
    summary = "An argmax, top-k, sort, NMS or threshold decides on values whose margins are within the predicted error."
    severity = "warning"
    why = """
A decision turns a small numeric difference into a different index, box or mask. When the gap
between the top two scores, or between a score and its threshold, is smaller than the error the
precision adds, the decision flips: another class wins, NMS keeps a different box, a detection
appears or disappears. Elementwise comparison of the outputs then fails by whole units, which is
why torchvision compares detection scores rather than boxes.

Under `fp32` (float32 itself, TF32 off, against float64) the finding says so apart: decisions whose
margins lie within float32's own rounding go one way on one device and the other way on another
(kernels add in other orders), and the finding gives the fraction expected to differ between two
devices' float32 runs. No precision setting fixes those.
"""
    example = """
scores = self.head(features)        # top-2 logits 3e-4 apart
label = scores.argmax(dim=-1)       # flips under bf16 in a fraction of rows
"""
    fix = """
Compare pre-decision scores (or match detections) in tests instead of indices and boxes; keep the
values that feed the decision in float32; use a stable sort. At float32's own level only the first
helps: compare with a tolerance on decisions (a fraction of changed ones, matched detections), or
break ties in the sort.
"""
    bad = (Example(_offset_logits_classifier, "argmax over logits that share a large offset"),
           Example(_near_uniform_scores, "top-k over near-uniform scores in float32", {"precisions": ("fp32",)}))
    good = (Example(_confident_classifier, "argmax with a wide margin in every row"),)

    def check_graph(self, ctx):
        # One finding per decision site: a loop (NMS per class, a threshold per level) runs the same
        # line many times, and its flips add up.
        sites = {}
        for node in ctx.graph.nodes:
            if node.record(DecisionMargins) is not None:
                sites.setdefault((node.module_path, node.fn, node.location), []).append(node)
        for nodes in sites.values():
            finding = self._site_finding(ctx, nodes)
            if finding is not None:
                yield finding

    def _site_finding(self, ctx, nodes):
        units = sum(n.record(DecisionMargins).units for n in nodes)
        per_mode = {}
        between = {}  # floor modes: expected decisions that differ between two devices' runs
        for mode in ctx.modes:
            preds = [(n, ctx.predictions[mode].nodes[n.name]) for n in nodes]
            preds = [(n, p) for n, p in preds if p.flip_fraction is not None]
            if not preds:
                continue
            expected = sum(p.flip_fraction * n.record(DecisionMargins).units for n, p in preds)
            if MODES[mode].floor:
                between[mode] = sum((p.disagreement or 0.0) * n.record(DecisionMargins).units for n, p in preds)
            deciding = [(n, p, n.input_stats[deciding_input(n)] if len(n.input_stats) > deciding_input(n) else None)
                        for n, p in preds]
            relative = [p.received / stats.rms for n, p, stats in deciding if stats is not None and stats.rms > 0]
            per_mode[mode] = (expected, max(p.received for _, p in preds), max(relative) if relative else None)
        flagged = [m for m, (expected, _, _) in per_mode.items()
                   if expected / units >= MIN_FLIP_FRACTION or expected >= MIN_EXPECTED_FLIPS
                   or between.get(m, 0.0) / units >= MIN_FLIP_FRACTION or between.get(m, 0.0) >= MIN_EXPECTED_FLIPS]
        if not flagged:
            return None
        first = nodes[0]
        predicted = {m: ErrorFigure(rel, None, expected / units) for m, (expected, _, rel) in per_mode.items()}
        what = "threshold comparison" if first.kind == Kind.COMPARE else first.fn
        calls = f" ({len(nodes)} calls)" if len(nodes) > 1 else ""
        flips = ", ".join(f"{percent(per_mode[m][0] / units)} under {m}" for m in flagged)
        margins = [m for n in nodes for m in n.record(DecisionMargins).values]
        # (an NMS's boxes that no swap changes have margin inf: only ties may be left)
        smallest = min((m for m in margins if 0 < m < math.inf), default=0.0)
        tied = round(sum(ties(n.record(DecisionMargins).values) * n.record(DecisionMargins).units for n in nodes))
        message = (
            f"{ctx.display(first.name)} ({what}{calls}) decides on margins as small as {sci(smallest)} while the "
            f"predicted error of its input is {sci(per_mode[flagged[0]][1])} ({flagged[0]}): about {flips} of its "
            f"{units} decisions flip."
        )
        floor = [m for m in flagged if m in between]
        if floor:
            m = floor[0]
            message += (
                f" Under {m} about {percent(between[m] / units)} of them differ between two devices' float32 runs "
                f"(kernels that add in another order): these decisions flip at float32's own level; no precision "
                f"setting fixes that: compare with a tolerance on decisions (match detections, compare scores) "
                f"or sort ties."
            )
        if first in routers(ctx.graph):
            message += " It routes tokens to experts: a flipped route sends a token through another expert."
        collapsed = rounding_made_ties(ctx.graph, first, deciding_input(first))
        if tied and collapsed is not None:
            message += (f" {tied} of them are ties float32's own rounding made: {ctx.display(collapsed.name)} "
                        f"({collapsed.fn}) rounds {collapsed.record(RoundedTies).rounded} results that float64 "
                        "tells apart to equal float32 values (saturated scores), so against float64 the tie-break "
                        "goes either way under every precision, float32 itself included; they are counted as flips.")
        elif tied and not all(MODES[m].floor for m in flagged):  # against float64 (fp32) a float32 tie is a coin flip
            message += (f" {tied} of them are exact ties in float32 (margin 0: equal values, a property of the input "
                        "and the model, not of the precision), which the tie-break decides alike at every "
                        "precision; they are not counted as flips.")
        return self.finding(first, message, predicted=predicted, precisions=tuple(flagged))
