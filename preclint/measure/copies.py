"""Copies of a model for a run under another precision or on another device.

``copy.deepcopy`` refuses a module that holds tensors with autograd history as attributes (a cache
computed from its parameters), and it is slow: it copies every parameter only for a run to cast or
move it again. ``copy_to`` makes each parameter and buffer directly where and as the run needs it,
shares the ones that need no change, and walks the tree of modules itself where a module copies
as nn.Module does.
"""
from __future__ import annotations

import copy
from collections import OrderedDict
from typing import Any, Dict, Optional

import torch

from preclint.capture.autograd_state import tensors_with_history


def to_device(t: torch.Tensor, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
    """A copy of ``t`` on ``device`` (in ``dtype``). From the CPU to a GPU the copy goes through
    page-locked memory and does not wait: a copy from ordinary memory blocks until it is done, and
    one per parameter made the copying of a model to the GPU twice as long. (The caching host
    allocator keeps each staging block until its copy has run.)"""
    t = t.detach()
    if device.type == "cuda" and t.device.type == "cpu" and t.numel():
        try:
            staged = t if t.is_pinned() else t.pin_memory()
        except RuntimeError:  # no page-locked memory to be had: the plain copy
            staged = None
        if staged is not None:
            return staged.to(device, non_blocking=True).to(dtype or t.dtype)
    return t.to(device, dtype or t.dtype, copy=True)


def copy_to(module: torch.nn.Module, device: Optional[torch.device],
            dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are made directly on ``device`` (None:
    each on the device it is on) and, if floating point, in ``dtype``: deepcopy's memo takes the
    moved tensors, so no intermediate copy is made on the way. Parameters that need no move are
    shared."""
    memo = detached_state(module)
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in memo:
            continue
        target = dtype if dtype is not None and t.is_floating_point() else t.dtype
        where = t.device if device is None else device
        if isinstance(t, torch.nn.Parameter) and t.device == where and t.dtype == target:
            # a parameter already where and as it is needed: the copy shares its memory (nothing a
            # run writes into parameters, and a model of billions of them fits only once)
            moved = t.detach()
        else:
            moved = to_device(t, where, target)
        if isinstance(t, torch.nn.Parameter):
            moved = torch.nn.Parameter(moved, requires_grad=t.requires_grad)
        memo[id(t)] = moved
    return clone_module(module, memo)


def detached_state(module: torch.nn.Module) -> Dict[int, Any]:
    """A deepcopy memo that copies the tensors with autograd history a module holds as attributes
    (a cache computed from its parameters) without that history: deepcopy refuses such tensors."""
    return {key: t.detach().clone() for key, t in tensors_with_history(module).items()}


def _plain_module(cls) -> bool:
    """A module class that copies as nn.Module does (no copy methods of its own)."""
    base = torch.nn.Module
    return (getattr(cls, "__deepcopy__", None) is None and cls.__reduce_ex__ is object.__reduce_ex__
            and cls.__reduce__ is object.__reduce__ and cls.__getstate__ is base.__getstate__
            and cls.__setstate__ is base.__setstate__ and not any("__slots__" in vars(k) for k in cls.__mro__))


_ATOMIC = (int, float, bool, str, type(None), torch.dtype, torch.device)


def _is_atomic(value) -> bool:
    """A value deepcopy would return as it is (a tuple of such values too)."""
    if type(value) is tuple:
        return all(_is_atomic(v) for v in value)
    return type(value) in _ATOMIC


def clone_module(module: torch.nn.Module, memo: Dict[int, Any]) -> torch.nn.Module:
    """``copy.deepcopy(module, memo)``, in a fraction of the time for modules that copy as nn.Module
    does: the tree of modules is walked directly, the empty hook tables are made new, parameter and
    buffer tables are filled from the memo (which holds every moved tensor) and values deepcopy
    would not copy are shared; anything else is deep-copied as deepcopy does, and any other module
    is handed to deepcopy."""
    if id(module) in memo:
        return memo[id(module)]
    cls = type(module)
    if not _plain_module(cls):
        return copy.deepcopy(module, memo)
    new = cls.__new__(cls)
    memo[id(module)] = new
    state: Dict[str, Any] = {}
    for key, value in module.__dict__.items():
        if key == "_modules":
            state[key] = type(value)((n, None if c is None else clone_module(c, memo)) for n, c in value.items())
        elif type(value) in (dict, OrderedDict, set) and not value:
            state[key] = type(value)()
        elif key in ("_parameters", "_buffers") and type(value) in (dict, OrderedDict) and all(
                t is None or id(t) in memo for t in value.values()):
            state[key] = type(value)((n, None if t is None else memo[id(t)]) for n, t in value.items())
        elif _is_atomic(value):
            state[key] = value
        else:
            state[key] = copy.deepcopy(value, memo)
    new.__setstate__(state)
    return new
