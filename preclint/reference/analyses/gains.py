"""Gains: how much a unit relative rounding error at each node reaches the model's output (the error
model of preclint.predict.error_model weighs every node's rounding by them). One backward pass from the outputs
gives them for every node at once; see preclint.reference.statistics_pass."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional

from preclint.reference.analyses import GradientAnalysis
from preclint.core.ir import DOT_PRODUCT_KINDS


@dataclass
class Gains:
    """How much the error a node adds reaches the output, from the reference pass's backward passes:
    each is ||J^T v||^2 / N_out for a unit relative error of what is rounded."""

    out: float  # rounding the node's result
    operands: Optional[float] = None  # rounding the operands of a dot product
    inputs: Optional[float] = None  # rounding the inputs of another op: sqrt(inputs / out) is how it amplifies
    # the same per input node (what ``inputs`` adds up): each input's error weighed by its own gain.
    # An input spread over many outputs (a broadcast, a gathered table) counts per output element, so
    # its gain is divided by the outputs each of its elements reaches (see the module's docstring)
    by_input: Dict[str, float] = field(default_factory=dict)
    rounding: Dict[str, float] = field(default_factory=dict)  # format -> the exact rounding of the result, where measured

    @property
    def amplification(self) -> Optional[float]:
        """sqrt(inputs / out): how many times the op multiplies a relative error arriving at its inputs;
        None where the gradients do not tell."""
        if self.inputs is None or not self.out or self.out <= 0 or not math.isfinite(self.inputs / self.out):
            return None
        return math.sqrt(self.inputs / self.out)


class GainsAnalysis(GradientAnalysis):
    record = Gains

    def finish(self, graph, passes) -> None:
        main = passes.main()
        if main is None:
            return
        for name, (gain_out, gain_operands) in main.gains.items():
            node = graph.get(name)
            if node is None:  # operands of a call that made no node (it returned no tensor)
                continue
            gains = Gains(gain_out, rounding=main.exact.get(name, {}))
            if name in main.operands:
                if node.kind in DOT_PRODUCT_KINDS:
                    gains.operands = gain_operands
                elif name in main.inputs:
                    gains.inputs, gains.by_input = main.inputs[name]
            node.put(gains)
