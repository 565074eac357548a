"""Decision gains: how the roundings upstream of a decision (or a rounding to integers) reach the
values it decides on, from a backward pass rooted at its input; flips are predicted from them and
the margins. For argmax-like decisions, also along the winner-minus-runner-up direction: errors the
two values share (both logits come from the same features) do not flip the decision."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import Node
from preclint.reference.analyses import GradientAnalysis
from preclint.reference.analyses.gains import GainSums, gains_toward, rounded_operands
from preclint.reference.analyses.margins import DecisionMargins, RoundingMargins, deciding_input

if TYPE_CHECKING:
    import torch

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

    def watch(self, node: Node, call: Call) -> List[torch.Tensor]:
        return rounded_operands(node, call)  # the gains toward a decision weigh what the gains do

    def finish(self, graph, passes) -> None:
        # One backward pass per decision site (a line run in a loop, like NMS per class, is one
        # site): the riskiest call of the site stands for the others, whose inputs are alike.
        sites: Dict[tuple, List[Tuple[float, Node]]] = {}
        for node in graph.nodes:
            margins = node.record(DecisionMargins) or node.record(RoundingMargins)
            deciding = deciding_input(node)
            if (margins and node.inputs and len(node.input_stats) > deciding and node.input_stats[deciding] is not None
                    and passes.root(node.inputs[deciding]) is not None):
                rms = node.input_stats[deciding].rms or 1.0
                key = (node.module_path, node.fn, node.location)
                sites.setdefault(key, []).append((min(margins.values) / rms, node))
        riskiest = [(min(members, key=lambda m: (m[0], m[1].name)), members) for members in sites.values()]
        riskiest.sort(key=lambda item: (item[0][0], item[0][1].name))
        for (_, representative), members in riskiest[:MAX_DECISION_PASSES]:
            upstream, gap = toward(passes, representative)
            for _, node in members:
                node.put(DecisionGains(upstream, gap))


def toward(passes, node: Node) -> Tuple[Dict[str, Tuple[float, float]], Optional[Dict[str, Tuple[float, float]]]]:
    """The gains toward the input of decision ``node``, and along its winner minus runner-up direction
    where it picks a winner per row."""
    root = passes.root(node.inputs[deciding_input(node)]) if node.inputs else None
    if root is None:
        raise ValueError(f"{node.name}'s input cannot root a backward pass")
    gains = gains_toward(passes, root)
    gap = gap_direction(node, root)
    return gains, (gap_gains(passes, root, *gap) if gap else None)


def gap_direction(node: Node, value: torch.Tensor) -> Optional[Tuple[torch.Tensor, int, int]]:
    """For an argmax/argmin (or max/min over a dim): +1 at each row's winner and -1 at its runner-up,
    the number of rows, and the dim. A backward pass along it weighs what changes the margin itself: errors
    the two values share (both logits come from the same features) do not flip the decision."""
    import torch

    dim = node.attrs.get("dim")
    if node.fn not in ("argmax", "argmin", "max", "min") or not isinstance(dim, int) or value.dim() == 0 or not value.numel():
        return None
    if value.shape[dim] < 2:
        return None
    with torch.no_grad():
        x = value.detach()
        top = x.topk(2, dim=dim, largest=node.fn in ("argmax", "max")).indices
        direction = torch.zeros_like(x)
        direction.scatter_(dim, top.narrow(dim, 0, 1), 1.0)
        direction.scatter_(dim, top.narrow(dim, 1, 1), -1.0)
    return direction, x.numel() // x.shape[dim], dim % x.dim()


def gap_gains(passes, root: torch.Tensor, direction: torch.Tensor, rows: int, dim: int) -> Dict[str, Tuple[float, float]]:
    """Gains of the decisions' margins, per row: backward passes along the winner-minus-runner-up
    direction with a random sign per row, so that errors shared by different rows (a rounded weight)
    add up as they do row by row, not as one sum over all rows."""
    import torch

    generator = torch.Generator().manual_seed(2)
    probes = max(1, min(4, math.ceil(64 / rows)))
    total: Dict[str, List[float]] = {}
    for _ in range(probes):
        shape = list(direction.shape)
        shape[dim] = 1
        signs = torch.randint(0, 2, shape, generator=generator).to(direction.device, direction.dtype) * 2 - 1
        sums = GainSums()
        run = passes.run([root], [sums], cotangents=[direction * signs])
        for name, (gain_out, gain_operands) in sums.gains(passes.operands, rows, run.unknown).items():
            acc = total.setdefault(name, [0.0, 0.0])
            acc[0] += gain_out / probes
            acc[1] += gain_operands / probes
    return {name: (v[0], v[1]) for name, v in total.items()}
