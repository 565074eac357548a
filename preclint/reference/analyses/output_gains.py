"""Output gains: how every rounding reaches each output of a model that returns several, from a
backward pass rooted at that output alone.

The pass from the outputs weighs all of them together, so it tells the whole output's error, not each
output's. Apportioning that whole among the outputs op by op (predict.relative_errors) misreads ops
that move values: a KV-cache decode step returns its logits beside the key and value caches, each
cache the input cache passed through exactly with one new row appended; taken op by op the caches
carried the new row's error on every row, and the logits, 16 times fewer elements than the caches,
were predicted 12-14x under the measured error. A pass from each output weighs each rounding by what
reaches that output, as the pass from all of them does for the whole.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import Graph, Node
from preclint.reference.analyses import GradientAnalysis
from preclint.reference.analyses.gains import GainSums, rounded_operands

# Outputs with a pass of their own, each about as long as the pass from all outputs; a model that
# returns more keeps the op-by-op apportioning for all of them.
MAX_OUTPUT_PASSES = 8
# Random directions per output: as many as make DIRECTED_ELEMENTS of its elements, at least 2 and at
# most MAX_PROBES. A small output (MTCNN O-Net's 2-class probabilities of 8 faces: 16 elements, one
# logit difference each) has few independent directions: two passes estimated its tf32 error 2-4x
# under the measured one, 32 within 1.5-2.3x.
DIRECTED_ELEMENTS = 256
MAX_PROBES = 16


@dataclass
class OutputGains:
    """On the node that makes one of a model's outputs: node name -> (gain of rounding its result, of
    rounding its operands), per element of that output."""

    upstream: Dict[str, Tuple[float, float]]


def float_producers(graph: Graph) -> List[Node]:
    """The distinct nodes whose float values a model with one output node returns; [] otherwise."""
    outputs = graph.output_nodes
    if len(outputs) != 1:
        return []
    names = list(dict.fromkeys(outputs[0].inputs))
    nodes = [graph.get(name) for name in names]
    return [n for n in nodes if n is not None and n.out is not None and n.out.is_float]


class OutputGainsAnalysis(GradientAnalysis):
    record = OutputGains

    def watch(self, node: Node, call: Call) -> list:
        return rounded_operands(node, call)  # the gains toward an output weigh what the gains do

    def finish(self, graph, passes) -> None:
        producers = float_producers(graph)
        if not 2 <= len(producers) <= MAX_OUTPUT_PASSES:
            return
        roots = [(node, passes.root(node.name)) for node in producers]
        if any(root is None for _, root in roots):
            return  # (an output without a gradient: none of them is judged apart from the others)
        for node, root in roots:
            sums = GainSums()
            probes = max(2, min(MAX_PROBES, math.ceil(DIRECTED_ELEMENTS / max(1, root.numel()))))
            run = passes.run([root], [sums], seed=1, probes=probes)
            node.put(OutputGains(sums.gains(passes.operands, run.units, run.unknown)))
