"""Parameters two readers share (an embedding tied to the output head, a weight two modules hold): the
gradient of such a leaf adds up every reader's, while a reduced mode rounds it only where a dot product
reads it (autocast and TF32 leave an embedding's gather in float32). The reference pass hands each dot
product that reads a tied weight a view of it for that call, whose gradient is that reader's alone.

Tied, BART's logits were predicted 3.5x over the measured TF32 error (the gather's gradient counted as
the head's); untied, or with a view a call, 1.1-1.5x.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch


class TiedWeights:
    """Who reads each parameter, and the module weights lent a view for one call."""

    def __init__(self) -> None:
        self.readers: Dict[int, set] = {}  # id of a parameter -> the modules holding it, the ops taking it
        self.lent: List[Tuple[torch.nn.Module, str, torch.Tensor]] = []

    def note(self, fn: str, args, kwargs, callee) -> None:
        """Record what a call reads: the parameters a module holds itself, the leaves an op takes."""
        if isinstance(callee, torch.nn.Module):
            for p in callee._parameters.values():
                if isinstance(p, torch.Tensor):
                    self.readers.setdefault(id(p), set()).add(id(callee))
        for v in (*args, *kwargs.values()):
            if isinstance(v, torch.Tensor) and v.is_leaf and v.requires_grad:
                self.readers.setdefault(id(v), set()).add(fn)

    def tied(self, weight: torch.Tensor) -> bool:
        """Whether another module or op has read ``weight`` too (a module called again is one reader)."""
        return len(self.readers.get(id(weight), ())) > 1

    def lend(self, module, weight: torch.Tensor, view: torch.Tensor) -> bool:
        """Let ``module`` read ``view`` for ``weight`` until ``give_back``; False where it does not hold
        ``weight`` as a parameter of its own (a submodule's, or a parametrization's property)."""
        name = held_as(module, weight)
        if name is None:
            return False
        module._parameters[name] = view
        self.lent.append((module, name, weight))
        return True

    def give_back(self) -> None:
        while self.lent:
            module, name, weight = self.lent.pop()
            module._parameters[name] = weight


def held_as(module, weight: torch.Tensor) -> Optional[str]:
    """The name ``module`` holds ``weight`` under as a parameter of its own, or None."""
    if not isinstance(module, torch.nn.Module):
        return None
    return next((name for name, p in module._parameters.items() if p is weight), None)
