"""pytree's flatten and map for what an op's arguments and results are made of.

Every pass hands each op's arguments and outputs through these several times, and pytree's general
walk (a registry lookup and a spec node per container) costs more than recording the op. Nearly
all of them are plain tuples, lists and dicts of tensors, numbers, slices and None, nested a level
or two (``torch.cat((a, b), dim=-1)``, ``x[..., :n]``, ``x.view(shape)``); those are walked here
directly, in pytree's order (a dict by insertion, as pytree flattens it), and anything else (a
namedtuple, a ModelOutput, a registered type) goes to pytree, so the leaves are always pytree's.
(Rebuilt, a torch.Size stays a Size, as the op was given it; pytree makes it a tuple.)
"""
from __future__ import annotations

from typing import Any, Callable, Tuple

import torch
from torch.utils._pytree import SUPPORTED_NODES, tree_flatten, tree_map, tree_unflatten

_CONTAINERS = (list, tuple, dict)
# exactly these types (their subclasses are registered on their own); a torch.Size is a tuple of ints
_PLAIN = (tuple, list, dict, torch.Size)


def is_leaf(value) -> bool:
    """A leaf to pytree: neither a container nor a type registered as one (a ModelOutput, a dataclass)."""
    return not isinstance(value, _CONTAINERS) and type(value) not in SUPPORTED_NODES


def _collect(value, out: list) -> bool:
    """Append the leaves of a plain container to ``out``; False where it holds anything else."""
    items = value.values() if type(value) is dict else value
    for v in items:
        if type(v) in _PLAIN:
            if not _collect(v, out):
                return False
        elif is_leaf(v):
            out.append(v)
        else:
            return False
    return True


def leaves(value) -> list:
    """tree_flatten's leaves of ``value``."""
    if isinstance(value, torch.Tensor):
        return [value]
    if type(value) in _PLAIN:
        out: list = []
        if _collect(value, out):
            return out
    elif is_leaf(value):  # a dtype, a device, a number (what a property returns)
        return [value]
    return tree_flatten(value)[0]


def _rebuild(value, it):
    """``value``'s plain containers with their leaves taken from ``it`` in order."""
    t = type(value)
    if t is dict:
        return {k: _rebuild(v, it) for k, v in value.items()}
    if t is tuple or t is list or t is torch.Size:
        return t(_rebuild(v, it) for v in value)
    return next(it)


def flatten(args, kwargs) -> Tuple[list, Callable[[list], Tuple[Any, Any]]]:
    """(leaves, rebuild) of a call's arguments: ``rebuild(new_leaves)`` gives (args, kwargs) of the
    same structure holding them."""
    if all(map(is_leaf, args)) and all(map(is_leaf, kwargs.values())):  # a flat call, the most common
        n, keys = len(args), list(kwargs)
        return [*args, *kwargs.values()], lambda new: (tuple(new[:n]), dict(zip(keys, new[n:])))
    call = (tuple(args), dict(kwargs))
    out: list = []
    if _collect(call, out):
        return out, lambda new: _rebuild(call, iter(new))
    flat, spec = tree_flatten(call)
    return flat, lambda new: tree_unflatten(list(new), spec)


def map_tensors(fn: Callable[[torch.Tensor], Any], value):
    """``value`` with ``fn`` applied to each tensor leaf (pytree's tree_map over tensors)."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if type(value) in _PLAIN:
        out: list = []
        if _collect(value, out):
            return _rebuild(value, iter([fn(v) if isinstance(v, torch.Tensor) else v for v in out]))
    return tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, value)
