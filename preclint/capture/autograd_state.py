"""The autograd state a capture run leaves on a model: which tensors it holds have history, and
detaching the ones the run gave it (a model must come out of preclint as it went in)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Dict, Set

import torch


def has_history(t: torch.Tensor) -> bool:
    """Whether ``t`` has autograd history. torch refuses to read the ``grad_fn`` of a view made in
    inference mode whose base was written in place since (RuntimeError): whether it requires grad
    answers for it."""
    try:
        return t.grad_fn is not None
    except RuntimeError:
        return t.requires_grad


def _without_history(value, keep: Set[int], depth: int = 0):
    """``value`` with every tensor that has autograd history in it detached (but those in ``keep``):
    containers are changed in place (lists, dicts) or rebuilt (tuples); anything else is returned as
    it is. ``keep`` collects the tensors with history when it is given a fresh set to fill."""
    if isinstance(value, torch.Tensor):
        return value.detach() if has_history(value) and id(value) not in keep else value
    if depth > 3:
        return value
    if type(value) is list:
        for i, v in enumerate(value):
            new = _without_history(v, keep, depth + 1)
            if new is not v:
                value[i] = new
    elif type(value) in (dict, OrderedDict):
        for k, v in list(value.items()):
            new = _without_history(v, keep, depth + 1)
            if new is not v:
                value[k] = new
    elif type(value) is tuple:
        items = tuple(_without_history(v, keep, depth + 1) for v in value)
        if any(a is not b for a, b in zip(items, value)):
            return items
    return value


def _module_state(module: torch.nn.Module):
    """(module, attribute name, value) of what a module keeps beside its parameters and submodules."""
    for m in module.modules():
        for key, value in list(vars(m).items()):
            if key not in ("_parameters", "_modules") and not key.startswith("__"):
                yield m, key, value


def tensors_with_history(module: torch.nn.Module) -> Dict[int, torch.Tensor]:
    """The tensors with autograd history that ``module`` holds beside its parameters, by id."""
    found: Dict[int, torch.Tensor] = {}

    def visit(value, depth=0):
        if isinstance(value, torch.Tensor):
            if has_history(value):
                found[id(value)] = value
        elif depth <= 3 and type(value) in (list, tuple, dict, OrderedDict):
            for v in (value.values() if isinstance(value, dict) else value):
                visit(v, depth + 1)

    for _, _, value in _module_state(module):
        visit(value)
    return found


def release_autograd_state(module: torch.nn.Module, keep: Set[int] = frozenset()) -> None:
    """Detach the tensors a model kept from a run with gradients (caches such as a detector's anchors).

    preclint runs the model with inputs that require gradients, and hands it leaves for the constants
    it computes; what the model stores on itself would then carry autograd history the user's own runs
    never give it: the graph of the whole run stays alive, and the model can no longer be deep-copied.
    ``keep``: tensors the model held before the run (tensors_with_history), left as they are.
    """
    for m, key, value in _module_state(module):
        new = _without_history(value, keep)
        if new is not value:
            m.__dict__[key] = new
