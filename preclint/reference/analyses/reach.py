"""Reach: for values beyond float16's range, the largest magnitude among the elements the output
depends on. What a ``where`` or ``masked_fill`` drops, or softmax turns into an exact 0 (a
finfo.min mask), has gradient 0, so overflowing there reaches nothing (PCL101, PCL102)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional

from preclint.reference.analyses import GradientAnalysis


@dataclass
class Reach:
    """The largest magnitude among the elements the output depends on (nonzero gradient), for values
    beyond float16's range: below absmax where the model masks or discards large values. Without it,
    absmax stands."""

    absmax: float


class ReachAnalysis(GradientAnalysis):
    record = Reach

    def listen(self, passes) -> Optional["ReachAnalysis"]:
        self.large = passes.large
        self.largest: Dict[str, float] = {}
        return self if self.large else None

    def on_grad(self, name: str, value, grad) -> None:
        if name in self.large and grad.shape == value.shape:
            live = value.abs()[(grad.detach() != 0) & value.isfinite()]
            if live.numel():
                self.largest[name] = max(self.largest.get(name, 0.0), float(live.max()))

    def finish(self, graph, passes) -> None:
        if not passes.large:  # nothing beyond float16's range: no backward pass needed for this
            return
        if passes.main() is None:
            return
        # (a value without any nonzero gradient is on a path autograd cannot follow: unknown)
        for name, largest in self.largest.items():
            node = graph.get(name)
            if node is not None:
                node.put(Reach(largest))
