"""Reach: for values beyond float16's range, the largest magnitude among the elements the output
depends on. What a ``where`` or ``masked_fill`` drops, or softmax turns into an exact 0 (a
finfo.min mask), has gradient 0, so overflowing there reaches nothing (PCL101, PCL102)."""
from __future__ import annotations

from dataclasses import dataclass

from preclint.reference.analyses import GradientAnalysis


@dataclass
class Reach:
    """The largest magnitude among the elements the output depends on (nonzero gradient), for values
    beyond float16's range: below absmax where the model masks or discards large values. Without it,
    absmax stands."""

    absmax: float


class ReachAnalysis(GradientAnalysis):
    record = Reach

    def finish(self, graph, passes) -> None:
        if not passes.large:  # nothing beyond float16's range: no backward pass needed for this
            return
        main = passes.main()
        if main is None:
            return
        # (a value without any nonzero gradient is on a path autograd cannot follow: unknown)
        for name, largest in main.reach.items():
            node = graph.get(name)
            if node is not None:
                node.put(Reach(largest))
