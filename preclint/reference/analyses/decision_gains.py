"""Decision gains: how the roundings upstream of a decision (or a rounding to integers) reach the
values it decides on, from a backward pass rooted at its input; flips are predicted from them and
the margins. For argmax-like decisions, also along the winner-minus-runner-up direction: errors the
two values share (both logits come from the same features) do not flip the decision."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from preclint.reference.analyses import GradientAnalysis
from preclint.reference.analyses.margins import DecisionMargins, RoundingMargins
from preclint.core.ir import Node

# Decisions whose input is checked for flips by a backward pass of its own; more would make the
# reference pass slow on detectors, and the riskiest ones (smallest relative margin) come first.
MAX_DECISION_PASSES = 8


@dataclass
class DecisionGains:
    """The gains toward a decision's (or rounding's) input rather than the output: node name -> (gain of
    rounding its result, of rounding its operands), per decision unit."""

    upstream: Dict[str, Tuple[float, float]]
    gap: Optional[Dict[str, Tuple[float, float]]] = None  # along winner minus runner-up (argmax-like decisions)


class DecisionGainsAnalysis(GradientAnalysis):
    record = DecisionGains
    needs = (DecisionMargins, RoundingMargins)

    def finish(self, graph, passes) -> None:
        # One backward pass per decision site (a line run in a loop, like NMS per class, is one
        # site): the riskiest call of the site stands for the others, whose inputs are alike.
        sites: Dict[tuple, List[Tuple[float, Node]]] = {}
        for node in graph.nodes:
            margins = node.record(DecisionMargins) or node.record(RoundingMargins)
            if margins and node.inputs and node.input_stats and passes.root(node.inputs[0]) is not None:
                rms = node.input_stats[0].rms or 1.0
                key = (node.module_path, node.fn, node.location)
                sites.setdefault(key, []).append((min(margins.values) / rms, node))
        riskiest = [(min(members, key=lambda m: (m[0], m[1].name)), members) for members in sites.values()]
        riskiest.sort(key=lambda item: (item[0][0], item[0][1].name))
        for (_, representative), members in riskiest[:MAX_DECISION_PASSES]:
            upstream, gap = passes.toward(representative)
            for _, node in members:
                node.put(DecisionGains(upstream, gap))
