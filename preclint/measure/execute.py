"""What a run followed node by node needs to call a node again: the tensors of a value, a node's
call made again, and which node produced a tensor. The probe's passes and the sweep (measure/sweep.py)
share it. (A copy of the model is run through measure/program.py's Program; the copies are made by
measure/copies.py.)
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.load.modelio import output_tensors


def tensors(value) -> List[torch.Tensor]:
    """The tensors in a (nested) value: a node's outputs, numbered as the reference pass numbers them
    (dataclasses and ModelOutputs included)."""
    return output_tensors(value)


def invoke(callee, args, kwargs):
    """Call what a node called: a module (never in place), a function, or a tensor method by name."""
    if isinstance(callee, torch.nn.Module):
        with not_inplace(callee):
            return callee(*args, **kwargs)
    if isinstance(callee, str):
        return getattr(args[0], callee)(*args[1:], **kwargs)
    return callee(*args, **kwargs)


@contextlib.contextmanager
def not_inplace(module: torch.nn.Module):
    restore = getattr(module, "inplace", None) is True
    if restore:
        module.inplace = False
    try:
        yield
    finally:
        if restore:
            module.inplace = True


class Producers:
    """Which node produced a tensor, by identity: the recorder's bookkeeping, kept by the walk itself
    so that it also knows the index of the tensor among the node's outputs.

    Entries hold weak references, so an id reused by a later tensor is never mistaken for the old one.
    """

    def __init__(self) -> None:
        self._by_id: Dict[int, Tuple[Any, str, int]] = {}

    def add(self, name: str, outputs: List[torch.Tensor]) -> None:
        for index, t in enumerate(outputs):
            self._by_id[id(t)] = (weakref.ref(t), name, index)

    def alias(self, t: torch.Tensor, source: Tuple[str, int]) -> None:
        """``t`` stands for the value of another node's output."""
        self._by_id[id(t)] = (weakref.ref(t), source[0], source[1])

    def get(self, t: torch.Tensor) -> Optional[Tuple[str, int]]:
        entry = self._by_id.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return entry[1], entry[2]
