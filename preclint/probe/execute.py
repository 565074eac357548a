"""Running one copy of the model through the capture path the check used, with an observer.

Every pass of the probe (the float64 reference, each precision mode, the sensitivity pass, the
one-layer-at-a-time runs) executes the same ops in the same order, so their values line up node by
node by name:

* FX models: the graph the check traced is re-rooted on each copy of the model; capture's
  interpreter runs it and hands each value to the observer. A run can start part-way, from values of an earlier run (``initial_env``).
* Models FX cannot trace: capture's function-mode recorder runs the copy eagerly; its node names are
  assigned in execution order, so they match as long as control flow does (the probe checks).
"""
from __future__ import annotations

import contextlib
import copy
import weakref
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx as fx

from preclint.capture import ops
from preclint.capture.graph import (FxRunner, ModelRunError, capture_function_mode, fx_arguments, is_inplace_call,  # noqa: F401
                              tensors_with_history)
from preclint.core.errors import one_line
from preclint.core.ir import Graph
from preclint.load.modelio import output_tensors
from preclint.capture.observer import Observer


class _Tracer(fx.Tracer):
    """capture's tracer without stack traces (for graphs built without the check's trace): the same
    leaves, so the same nodes and names."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return ops.is_leaf_module(m)


class RunFailed(Exception):
    """The model raised while the probe ran it; ``cause`` is the original exception."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(one_line(cause))
        self.cause = cause


class Program:
    """The model as the probe executes it, on any copy (float64, float16, rounded weights)."""

    def __init__(self, graph: Graph, module: torch.nn.Module) -> None:
        self.ir_nodes = {n.name: n for n in graph.nodes}
        self.order = [n.name for n in graph.nodes]
        self.fx_graph: Optional[fx.Graph] = None
        self.note: Optional[str] = None
        self.stream = None  # the WeightStream the copies' blocks are filled from, when streamed
        self.recorded: Optional[list] = None  # the nodes the last eager run recorded
        if graph.capture == "fx":
            traced = graph.fx_graph if graph.fx_graph is not None else _Tracer().trace(module)
            if [n.name for n in traced.nodes] == self.order:
                self.fx_graph = traced
            else:  # cannot happen for a deterministic trace; run eagerly rather than mislabel values
                self.note = "the model traced differently a second time; the probe recorded its ops eagerly instead"
        self._fx_nodes = {n.name: n for n in self.fx_graph.nodes} if self.fx_graph is not None else {}

    @property
    def is_fx(self) -> bool:
        return self.fx_graph is not None

    def run(self, root: torch.nn.Module, inputs, observer: Observer, initial_env: Optional[Dict[str, Any]] = None):
        """The model's output on ``inputs`` (a tuple, or Inputs with keywords); ``initial_env`` (FX
        only) maps node names to values not to recompute."""
        if self.stream is not None:
            observer = self.stream.observing(observer, root)
        try:
            if self.fx_graph is None:
                self.recorded, output = capture_function_mode(root, inputs, observer, locate=False)
                return output
            # the graph runs on the copy itself: its call_module and get_attr targets are the copy's;
            # the check recorded the reduction lengths from the same shapes already
            runner = FxRunner(root, self.ir_nodes, observer, graph=self.fx_graph, record=False)
            env = {self._fx_nodes[name]: value for name, value in (initial_env or {}).items()}
            return runner.run(*fx_arguments(self.fx_graph, root, inputs), initial_env=env or None)
        except ModelRunError as exc:
            raise RunFailed(exc.cause) from exc.cause
        except RunFailed:
            raise
        except Exception as exc:
            raise RunFailed(exc) from exc


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
    """Which node produced a tensor, by identity: the recorder's bookkeeping, kept by the probe itself
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


def copy_to(module: torch.nn.Module, device: torch.device, dtype: Optional[torch.dtype] = None) -> torch.nn.Module:
    """A deep copy of ``module`` whose parameters and buffers are made directly on ``device`` (and,
    if floating point, in ``dtype``): deepcopy's memo takes the moved tensors, so no intermediate
    copy is made on the way. Parameters that need no move are shared."""
    memo = detached_state(module)
    for t in list(module.parameters()) + list(module.buffers()):
        if id(t) in memo:
            continue
        target = dtype if dtype is not None and t.is_floating_point() else t.dtype
        if isinstance(t, torch.nn.Parameter) and t.device == device and t.dtype == target:
            # a parameter already where and as it is needed: the copy shares its memory (nothing the
            # probe does writes into parameters, and a model of billions of them fits only once)
            moved = t.detach()
        else:
            moved = to_device(t, device, target)
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
