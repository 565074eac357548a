"""Gains: how much a unit relative rounding error at each node reaches the model's output (the error
model of preclint.predict.error_model weighs every node's rounding by them). One backward pass from the outputs
gives them for every node at once; see preclint.reference.statistics_pass."""
from __future__ import annotations

from preclint.reference.analyses import GradientAnalysis
from preclint.core.ir import DOT_PRODUCT_KINDS, Gains


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
