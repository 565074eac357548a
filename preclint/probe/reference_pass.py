"""The float64 reference: the model in float64 on the probe's device; every node's value is kept
(rounded to float32 unless the ablation needs the float64 values: ReferenceStore)."""
from __future__ import annotations

import math
import weakref
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.core.ir import Kind
from preclint.capture.calls import is_inplace_call
from preclint.capture.observer import Observer
from preclint.measure.program import Program
from preclint.measure.execute import tensors
from preclint.probe.scalars import Scalars
from preclint.capture.trees import flatten


class ReferenceStore:
    """Every node's value in the float64 run, and each float value's squared norm.

    ``keep_float64``: keep the values as computed (the ablation re-runs the reference from them).
    Otherwise each float64 value is kept rounded to float32, the precision of the model itself:
    the rounding (2^-24 relative) is far below the error of every mode the probe measures (2^-11
    and up), and it halves the memory of the store and the traffic of every comparison with it.
    The reference run itself computes in float64 throughout; the norms are those of the kept values.
    """

    def __init__(self, keep_float64: bool = True) -> None:
        self.keep_float64 = keep_float64
        self.values: Dict[str, List[torch.Tensor]] = {}
        self.raw: Dict[str, Any] = {}  # the node's output as it came, with keep_float64 only
        self.order: List[str] = []
        self.fns: Dict[str, str] = {}
        self.norms: Dict[Tuple[str, int], int] = {}  # (node, output index) -> index of ||value||_2
        self.scalars = Scalars()
        self.output: Any = None
        self.downcasts: List[str] = []  # nodes whose float result is not float64 (the model casts down)
        self.nonfinite: set = set()  # (node, output index) whose reference holds inf or NaN
        self.finite_norms: Dict[Tuple[str, int], float] = {}
        # id of a float64 value that owns its memory -> (weak reference, its version, its float32 copy)
        self._copies: Dict[int, Tuple[Any, int, torch.Tensor]] = {}

    def as_float32(self, t: torch.Tensor) -> torch.Tensor:
        """A node's value (as the model made it, not detached: views know their base) for keeping,
        a float64 one rounded to float32. A view of a value kept already (reshape,
        permute, slicing: a transformer's shape ops) is the same view of that value's copy, so that
        the store holds each float64 tensor's memory once."""
        if t.dtype != torch.float64:
            return t.detach()
        if t.is_inference():  # no version counter to tell a later write: copied each time
            return t.to(torch.float32)
        owner = t if t._base is None else t._base
        known = self._copies.get(id(owner))
        if known is not None and known[0]() is owner and known[1] == t._version:
            return known[2] if t is owner else known[2].as_strided(t.size(), t.stride(), t.storage_offset())
        copy = t.to(torch.float32)
        if (t._base is None and t.is_contiguous() and t.storage_offset() == 0
                and t.numel() * t.element_size() == t.untyped_storage().nbytes()):
            self._copies[id(t)] = (weakref.ref(t), t._version, copy)
        return copy

    def norm(self, name: str, index: int) -> Optional[float]:
        """||value|| over its finite elements (a mask's -inf is no size)."""
        if (name, index) in self.finite_norms:
            return self.finite_norms[(name, index)]
        slot = self.norms.get((name, index))
        return None if slot is None else self.scalars[slot]

    def find_nonfinite(self) -> None:
        """Values that hold inf or NaN already in float64 (attention masks, -inf paddings): compared
        elementwise, an element that is the same inf (or NaN) in both runs has no error."""
        for key, slot in self.norms.items():
            if not math.isfinite(self.scalars[slot]):
                t = self.values[key[0]][key[1]]
                self.nonfinite.add(key)
                self.finite_norms[key] = float(torch.linalg.vector_norm(torch.where(torch.isfinite(t), t, t.new_zeros(()))))


def _widened(args, kwargs, callee=None, skip_first: bool = False):
    """Operands of a call that mixes float64 with lower floats, all in float64.

    A model that makes some values float32 itself (``coords.float()``, a float32 table) hands ops a
    float64 value from the reference's copy beside a float32 one, which ops that want one dtype (grid
    sampling, index_put) refuse. Widened, they run as the float32 model runs them, and more exactly.
    The target of an in-place op keeps its dtype: the op must write into it."""
    flat, rebuild = flatten(args, kwargs)
    floats = [v.dtype for v in flat if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if isinstance(callee, torch.nn.Module):  # a layer's own weights are operands too
        floats += [p.dtype for p in callee.parameters(recurse=False) if p.is_floating_point()]
    if torch.float64 not in floats or all(d == torch.float64 for d in floats):
        return args, kwargs
    widened = [v.to(torch.float64) if isinstance(v, torch.Tensor) and v.is_floating_point() and not (skip_first and i == 0)
               else v for i, v in enumerate(flat)]
    return rebuild(widened)


class WideningObserver(Observer):
    """Runs the model as the reference pass does (mixed float operands widened to float64), keeping
    nothing: the reference's second run (noise.py)."""

    def before(self, node, args, kwargs, callee):
        inplace = bool(args) and isinstance(args[0], torch.Tensor) and is_inplace_call(callee, kwargs)
        return _widened(args, kwargs, callee, skip_first=inplace)


class _ReferenceObserver(Observer):
    def __init__(self, store: ReferenceStore, protect_inplace: bool) -> None:
        self.store = store
        self.protect_inplace = protect_inplace
        # storage -> kept values that share it (a value the store did not copy: one the model computes
        # below float64, or any with keep_float64), the views of one another among them
        self.sharing: Dict[int, List[Tuple[str, int]]] = {}

    def before(self, node, args, kwargs, callee):
        inplace = args and isinstance(args[0], torch.Tensor) and is_inplace_call(callee, kwargs)
        # An eager in-place op (ReLU(inplace=True), Mixtral's `router_top_value /= ...`) would
        # overwrite the values kept for the nodes whose results share its operand's memory (that
        # operand, its base, its views): keep copies of those first.
        if self.protect_inplace and inplace:
            for name, j in self.sharing.pop(_storage(args[0]), []):
                kept = self.store.values[name]
                if _same_storage(kept[j], args[0]):
                    kept[j] = kept[j].clone()
        return _widened(args, kwargs, callee, skip_first=inplace)

    def __call__(self, node, args, kwargs, callee, output):
        if node.kind == Kind.OUTPUT:
            return output
        outs = [t.detach() for t in tensors(output)]
        store = self.store
        store.order.append(node.name)
        store.fns[node.name] = node.fn
        if any(t.is_floating_point() and t.dtype != torch.float64 for t in outs):
            store.downcasts.append(node.name)
        if store.keep_float64:
            store.values[node.name] = outs
            store.raw[node.name] = output
        else:
            store.values[node.name] = [store.as_float32(t) for t in tensors(output)]
        if self.protect_inplace:
            for j, (kept, made) in enumerate(zip(store.values[node.name], tensors(output))):
                if _same_storage(kept, made):
                    self.sharing.setdefault(_storage(kept), []).append((node.name, j))
        return output


def _storage(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage().data_ptr() if t.numel() else None
    except (RuntimeError, NotImplementedError):  # a tensor without storage (sparse, nested)
        return None


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return _storage(a) is not None and _storage(a) == _storage(b) and a.device == b.device


def reference_pass(program: Program, model64: torch.nn.Module, inputs64: tuple, keep_float64: bool) -> ReferenceStore:
    """Issue the float64 run; ``resolve_reference`` reads its figures back (the device works on
    in between, while Python issues the next pass)."""
    store = ReferenceStore(keep_float64)
    with torch.no_grad():
        store.output = program.run(model64, inputs64, _ReferenceObserver(store, protect_inplace=not program.is_fx))
    # the norms of the kept values, queued after the run: an eager in-place op may have replaced a
    # kept value by its copy in the meantime (_ReferenceObserver.before)
    for name, values in store.values.items():
        for j, t in enumerate(values):
            if t.is_floating_point():
                store.norms[(name, j)] = store.scalars.norms(t)[0]
    store.scalars.compute()
    return store


def resolve_reference(store: ReferenceStore) -> None:
    store.scalars.resolve()
    store.find_nonfinite()
