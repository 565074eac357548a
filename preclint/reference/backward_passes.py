"""The reference pass's backward passes: the pass from the model's outputs that every gradient analysis
listens to, passes from other roots an analysis asks for, and one pass that keeps no gradient but what
the hooks read (reference/statistics_pass.py's observer runs them)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

import torch

from preclint.core.ir import Graph
from preclint.core.notes import Note
from preclint.load.modelio import output_tensors

if TYPE_CHECKING:
    from preclint.reference.statistics_pass import ReferenceObserver, _Watched


@dataclass(frozen=True)
class Pass:
    """What a backward pass tells its listeners beyond the gradients they heard."""

    units: int  # the roots' elements times the directions drawn: what sums over the pass are per
    unknown: frozenset  # values overwritten in place where the observer could not see it: no gradient of theirs


class BackwardPasses:
    """The reference pass's backward passes, run when a gradient analysis asks for them: the pass from
    the model's outputs (``main``, once, heard by every analysis that listens to it) and passes from
    other roots, each heard by the listeners an analysis gives it (``run``)."""

    def __init__(self, observer: "ReferenceObserver", graph: Graph, output: Any) -> None:
        self.observer = observer
        self.graph = graph
        self.roots = [v for v in output_tensors(output) if v.is_floating_point() and v.requires_grad and v.numel()]
        self._main: Optional[Pass] = None

    @property
    def large(self) -> set:
        """Nodes with values beyond float16's range."""
        return self.observer.large

    @property
    def constants(self) -> set:
        """Nodes whose value is a constant (a buffer, a parameter read as a value, a table the forward
        builds from constants): rounded once, with errors known exactly."""
        return self.observer.constant_names

    @property
    def operands(self) -> Dict[str, List[_Watched]]:
        """Node name -> the operands it reads whose gradients the passes weigh, as the analyses watched
        them (``operand.tensor``: the view the op read, or a weight)."""
        return self.observer.operands

    def source(self, operand: _Watched) -> Optional[str]:
        """The node that made the value ``operand`` views (None for a weight)."""
        return self.observer.operand_sources.get(id(operand))

    def main(self) -> Optional[Pass]:
        """The pass from the model's outputs, along as many random directions as make 64 output
        elements (at most 4), heard by what each gradient analysis ``listen``s with; run the first time
        it is asked for, None when no float output has a gradient."""
        if self._main is None and self.roots:
            listeners = [heard for heard in (a.listen(self) for a in self.observer.gradient) if heard is not None]
            n_out = sum(r.numel() for r in self.roots)
            self._main = self.run(self.roots, listeners, seed=0, probes=max(1, min(4, math.ceil(64 / n_out))))
            unknown = self._main.unknown
            if unknown:
                self.graph.notes.append(Note(
                    "reference", f"{len(unknown)} value(s) were overwritten in place where preclint could not "
                    f"see it (first: {sorted(unknown)[0]}); their error propagation is not estimated"))
        return self._main

    def root(self, name: str) -> Optional[torch.Tensor]:
        """The value of node ``name`` as a root of a backward pass; None where it has no gradient or the
        model overwrote it since (its gradient would be that of the new values)."""
        observer = self.observer
        if name not in observer.values or observer.watched[name].changed or observer.watched[name].rectified:
            return None
        return observer.values[name]

    def run(self, roots: List[torch.Tensor], listeners: Sequence[Any], *, seed: int = 1, probes: int = 1,
            cotangents: Optional[List[torch.Tensor]] = None) -> Pass:
        """Backward passes from ``roots`` heard by ``listeners`` (analyses.GradientListener): ``probes``
        of them along random directions drawn with ``seed``, or one along ``cotangents``."""
        return self.observer.backward(roots, listeners, seed=seed, probes=probes, cotangents=cotangents)


def backward_for_hooks(roots: List[torch.Tensor], leaves: List[torch.Tensor], cotangents: List[torch.Tensor]) -> None:
    """One backward pass from ``roots`` to ``leaves`` whose gradients only the hooks read.

    ``torch.autograd.grad`` would return every leaf's gradient at once: for a model's weights, as much
    memory as the weights (52 GB for a 13B model in float32). Here each leaf's gradient is dropped as
    soon as it is made (the hooks have seen it by then); the leaves' own ``.grad`` is left as it was."""
    post = getattr(torch.Tensor, "register_post_accumulate_grad_hook", None)
    if post is None:  # torch before 2.1
        torch.autograd.grad(roots, leaves, grad_outputs=cotangents, retain_graph=True, allow_unused=True)
        return
    unique = list({id(t): t for t in leaves}.values())
    saved = {id(t): t.grad for t in unique if t.is_leaf}
    handles = []
    for t in unique:
        if t.is_leaf:
            t.grad = None
            handles.append(t.register_post_accumulate_grad_hook(_drop_grad))
    try:
        torch.autograd.backward(roots, grad_tensors=cotangents, retain_graph=True, inputs=unique)
    finally:
        for h in handles:
            h.remove()
        for t in unique:
            t.grad = saved.get(id(t)) if t.is_leaf else None


def _drop_grad(t: torch.Tensor) -> None:
    t.grad = None
