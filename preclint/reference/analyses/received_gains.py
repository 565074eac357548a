"""Received gains: how the roundings upstream of an op that amplifies error reach its inputs, from a
backward pass rooted at each input (as for decisions, analyses/decision_gains.py).

The error an op receives is otherwise estimated forward, op by op (predict.relative_errors), taking
each op's inputs' errors as independent (predict.passed_on). Where errors of one origin meet again
they add up instead: RAFT adds each iteration's flow update to coordinates that carry every earlier
iteration's error, and the updates' errors share their origin (the same features and context,
rounded once), so the coordinates' error grows with the iterations, not with their square root. A
pass rooted at the input follows every path from every rounding, as the passes from the outputs do."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Optional, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.reference.analyses import GradientAnalysis
from preclint.reference.analyses.gains import Gains, gains_toward, rounded_operands

# An op amplifies relative error when it multiplies it by at least this factor (sqrt(inputs / out) of
# its gains): an order of magnitude beyond ordinary ops, beyond the factor of 3 within which
# preclint's predictions hold (benchmarks/CLAIMS.md). PCL204 reports such ops where the error they
# pass on is large too.
AMPLIFICATION_LIMIT = 10.0
# Sums and dot products that amplify do so by cancelling (PCL203); batch norms by collapsed
# channels (PCL103): those rules judge them, and their inputs need no pass of their own here.
EXPLAINED_ELSEWHERE = frozenset({Kind.BATCHNORM}) | DOT_PRODUCT_KINDS
EXPLAINED_FNS = frozenset({"sum", "mean", "nansum", "nanmean", "cumsum"})
# Backward passes for the amplifiers' inputs, each as long as the model up to that input (on a large
# model each costs about what the pass from the outputs does); the strongest amplifiers first, and
# the others keep the estimate op by op (raft_small has 24 amplifiers, one input each to pass toward:
# its coordinates before and after each of 12 iterations).
MAX_RECEIVED_PASSES = 16
# Passes from the amplifiers' results (ReceivedGains.leaving), the strongest first; the others' leaving
# error is their inputs' amplified one by one
MAX_LEAVING_PASSES = 8


@dataclass
class ReceivedGains:
    """The gains toward the inputs of an op that amplifies error: input node name -> {upstream node name
    -> (gain of rounding its result, of rounding its operands)}, per element of that input. The error
    an input receives is then weighed along every path at once, where errors of one origin that meet
    again add up as they do (an iterative refinement adding each step's correction to coordinates that
    carry the earlier steps' error)."""

    upstream: Dict[str, Dict[str, Tuple[float, float]]]
    # the same toward the op's own result: the error that leaves it along every path. Where its inputs'
    # errors share an origin (a difference of two elements of one cumulative sum, Mamba2's
    # `A_cumsum[..., -1:] - A_cumsum`, shares the prefix's error) they cancel there, which the inputs'
    # errors amplified one by one do not tell
    leaving: Dict[str, Tuple[float, float]] = field(default_factory=dict)


def judged_amplification(node: Node) -> Optional[float]:
    """How many times ``node`` multiplies the relative error it receives, where PCL204 judges it: at
    least AMPLIFICATION_LIMIT, and not an op a rule explains better (EXPLAINED_*); else None."""
    if node.kind in EXPLAINED_ELSEWHERE or node.fn in EXPLAINED_FNS:
        return None
    gains = node.record(Gains)
    factor = gains.amplification if gains is not None else None
    return factor if factor is not None and factor >= AMPLIFICATION_LIMIT else None


def from_constants(graph: Graph) -> Dict[str, bool]:
    """Per node, whether its value is computed from constants alone (no model input, no parameter
    upstream): it carries only their own rounding, which the estimate op by op weighs exactly."""
    alone: Dict[str, bool] = {}
    for node in graph.nodes:  # (in the order they ran: inputs first)
        alone[node.name] = (node.kind != Kind.INPUT and node.fn != "parameter" and not node.params
                            and all(alone.get(n, False) for n in node.inputs))
    return alone


def roots_of(node: Node, constant: Dict[str, bool]) -> Iterable[str]:
    """The inputs of ``node`` whose received error is worth a pass of their own: those the op weighs
    by a gain of their own that do not come from constants alone."""
    gains = node.record(Gains)
    for name in dict.fromkeys(node.inputs):
        if name in gains.by_input and not constant.get(name, False):
            yield name


class ReceivedGainsAnalysis(GradientAnalysis):
    record = ReceivedGains
    needs = (Gains,)

    def watch(self, node: Node, call: Call) -> list:
        return rounded_operands(node, call)  # the gains toward an input weigh what the gains do

    def finish(self, graph, passes) -> None:
        amplifiers = []
        for node in graph.nodes:
            factor = judged_amplification(node)
            if factor is not None:
                amplifiers.append((-factor, node.name, node))
        amplifiers.sort(key=lambda item: item[:2])
        constant = from_constants(graph)
        done: Dict[str, Dict[str, Tuple[float, float]]] = {}
        budget = MAX_RECEIVED_PASSES
        for _, _, node in amplifiers:
            upstream: Dict[str, Dict[str, Tuple[float, float]]] = {}
            for name in roots_of(node, constant):
                if name not in done:
                    root = passes.root(name)
                    if root is None or budget <= 0:
                        continue
                    budget -= 1
                    done[name] = gains_toward(passes, root)
                upstream[name] = done[name]
            if upstream:
                node.put(ReceivedGains(upstream))
        # then the passes from the strongest amplifiers' results, with a budget of their own
        leaving_budget = MAX_LEAVING_PASSES
        for _, _, node in amplifiers:
            record = node.record(ReceivedGains)
            root = passes.root(node.name) if record is not None and leaving_budget > 0 else None
            if root is not None:
                leaving_budget -= 1
                record.leaving = gains_toward(passes, root)
