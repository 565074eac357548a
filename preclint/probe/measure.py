"""The measuring passes: the float64 reference, the sensitivity pass, and one sweep per mode.

* Reference: the model in float64 on the probe's device; every node's value is kept (rounded to
  float32 unless the ablation needs the float64 values: ReferenceStore).
* Sensitivity: the model with autograd; after each mode's sweep, one backward pass with the mode's
  measured output error as the cotangent gives J_i^T E at every node i at once, and so each node's
  contribution <J_i e_i, E> (ledger.py). Gradients only weight errors, a few digits are plenty, so
  on a GPU this pass runs under bfloat16 autocast.
* Sweep: the full run of the mode, observed and never altered (on a GPU the observed run is checked
  against the plain model afterwards). At each node the observer compares the value with the
  reference (received) and replays the node on reference inputs (local), keeping the local error
  vector for the contribution.

Figures are computed on the device and read back once per pass, after every mode has been issued
(``Scalars``, ``queue_figures``, ``finish``): a read per node would stall the GPU at every node, and
a read per mode would leave it idle while Python issues the next one.
"""
from __future__ import annotations

import contextlib
import math
import weakref
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.errors import one_line
from preclint.ir import DOT_PRODUCT_KINDS, Kind
from preclint.modelio import Inputs
from preclint.numerics import C_INPUT
from preclint.probe.execute import Producers, Program, flatten, invoke, is_inplace_call, tensors
from preclint.probe.detections import changed_decisions, detection_tensor_ids
from preclint.probe.detections import compare as compare_detections
from preclint.probe.ledger import Figure, ModeMeasure, NodeMeasure, ToleranceCheck
from preclint.probe.modes import ModeRun
from preclint.probe.rounding import REDUCED_FLOATS
from preclint.reference import hook_gradient

# A conv or matmul ran in TF32 when its local error is nearer (on a log scale) to TF32's size
# C_INPUT * 2^-11 * RMS(sqrt(sum (a b)^2)) than to float32's C_INPUT * 2^-24 * ...: the geometric
# midpoint is 2^-17.5. Measured TF32 layers sit within 3x of their size and float32 kernels within
# ~10x of theirs (longer sums), so the two never come near the threshold (a factor of 90 away).
TF32_THRESHOLD = 2.0 ** -17.5

_NO_REPLAY_KINDS = frozenset({Kind.INPUT, Kind.OUTPUT, Kind.CONSTANT, Kind.SHAPE, Kind.DECISION, Kind.COMPARE})

# max(x, 0), min(max(x, 0), 6) and the largest value of a window are exact in every float format:
# with its result in its input's dtype such an op adds no error, so it is not replayed (a replay
# would show only the rounding of its input, which the node that produced the input owns).
_EXACT_FNS = frozenset({"relu", "relu_", "relu6", "max_pool", "max_pool1d", "max_pool2d", "max_pool3d",
                        "adaptive_max_pool1d", "adaptive_max_pool2d", "adaptive_max_pool3d"})


class Scalars:
    """Zero-dimensional results gathered during a pass and read back in one transfer.

    Norms are queued rather than computed at once: ``compute()`` computes all of them with
    ``torch._foreach_norm``, a few launches per dtype (per node, two reductions and their Python
    calls would cost more than the node itself on a GPU), and gathers every figure into one float64
    vector per device without waiting for the device; ``resolve()`` reads the vectors back. Between
    the two the device works on while Python issues the next pass.
    """

    def __init__(self) -> None:
        self._values: List[Tuple[List[int], torch.Tensor]] = []  # (slots, one-dimensional tensor)
        self._queued: List[Tuple[torch.Tensor, int]] = []
        self._size = 0
        self._gathered: List[Tuple[List[int], torch.Tensor]] = []
        self.resolved: Optional[List[float]] = None

    def add(self, value: torch.Tensor) -> int:
        return self.add_vector(value.detach().reshape(1))

    def add_vector(self, values: torch.Tensor) -> int:
        """Slots of the elements of a one-dimensional tensor (the first one is returned)."""
        slot = self._size
        self._size += values.numel()
        self._values.append((list(range(slot, self._size)), values.detach()))
        return slot

    def norms(self, t: torch.Tensor) -> Tuple[int, int]:
        """Slots of ||t||_2 and ||t||_inf."""
        slot = self._size
        self._size += 2
        if t.device.type == "cpu":
            # nothing to overlap on the CPU: the two figures now, and the tensor is free (a pass
            # queues one difference per node, as much memory as the model's activations)
            t = t.detach()
            wide = torch.float32 if t.dtype in (torch.bfloat16, torch.float16) else None
            if t.numel():
                pair = torch.stack([torch.linalg.vector_norm(t, dtype=wide), torch.linalg.vector_norm(t, float("inf"), dtype=wide)])
                self._values.append(([slot, slot + 1], pair))
            return slot, slot + 1
        self._queued.append((t.detach(), slot))
        return slot, slot + 1

    def compute(self) -> None:
        """Issue the work of every figure, without waiting for the device; queued tensors are released."""
        if self._queued:
            for members, l2, linf in grouped_norms([t for t, _ in self._queued]):
                slots = [self._queued[i][1] for i in members]
                self._values.append((slots, l2))
                self._values.append(([s + 1 for s in slots], linf))
            self._queued = []  # the slots of empty tensors keep their 0
        by_device: Dict[Any, List[Tuple[List[int], torch.Tensor]]] = {}
        for slots, v in self._values:
            by_device.setdefault(v.device, []).append((slots, v))
        self._values = []
        for items in by_device.values():
            index = [i for slots, _ in items for i in slots]
            values = torch.cat([v.reshape(-1).to(torch.float64) for _, v in items])
            self._gathered.append((index, values))

    def resolve(self) -> None:
        if self.resolved is not None:
            return
        self.compute()
        out = [0.0] * self._size
        for index, values in self._gathered:
            for i, v in zip(index, values.cpu().tolist()):
                out[i] = v
        self._gathered = []
        self.resolved = out

    def __getitem__(self, index: int) -> float:
        return self.resolved[index]


def grouped_norms(tensors: List[torch.Tensor]) -> List[Tuple[List[int], torch.Tensor, torch.Tensor]]:
    """(positions, ||t||_2, ||t||_inf) per group of non-empty tensors of one dtype and device:
    ``torch._foreach_norm`` takes its fast path (a few launches for all tensors) only over such a
    group."""
    groups: Dict[Tuple[Any, Any], List[int]] = {}
    for i, t in enumerate(tensors):
        if t.numel():
            groups.setdefault((t.dtype, t.device), []).append(i)
    out = []
    for (dtype, _), members in groups.items():
        work = [tensors[i] for i in members]
        # bfloat16 errors are summed in float32 and their norms kept so (not rounded back)
        wide = torch.float32 if dtype in (torch.bfloat16, torch.float16) else None
        try:
            l2 = torch.stack(torch._foreach_norm(work, 2, dtype=wide))
            linf = torch.stack(torch._foreach_norm(work, float("inf"), dtype=wide))
        except (RuntimeError, TypeError, AttributeError):  # torch versions without the fused norms
            l2 = torch.stack([torch.linalg.vector_norm(t, dtype=wide) for t in work])
            linf = torch.stack([torch.linalg.vector_norm(t, ord=float("inf"), dtype=wide) for t in work])
        out.append((members, l2, linf))
    return out


def error_dtype(device: torch.device) -> torch.dtype:
    """The dtype error vectors are kept in. Their figures (norms, largest element, the products
    with gradients) need two or three digits, which bfloat16 gives with float32's range; on a GPU
    that halves the memory traffic of every comparison, which bounds the probe's time there. On
    the CPU bfloat16 arithmetic is slower than float32, so errors stay float32."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def difference(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype, same_inf: bool = False) -> torch.Tensor:
    """a - b computed in the wider of their dtypes (type promotion, in one pass) and stored as ``dtype``.

    The values compared are references (float32, or float64 for the ablation) and float32, float16
    or bfloat16 results; their difference is computed in the wider dtype and stored as ``dtype``
    (error_dtype): plenty for figures.
    ``same_inf``: elements that are the same inf (or both NaN) differ by 0, not NaN."""
    out = torch.empty(a.shape, dtype=dtype, device=a.device)
    d = torch.sub(a.detach(), b.detach(), out=out)
    if same_inf:
        d = d.masked_fill((a == b) | (a.isnan() & b.isnan()), 0.0)
    return d


# ------------------------------------------------------------------------------------- reference


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


class _ReferenceObserver:
    def __init__(self, store: ReferenceStore, protect_inplace: bool) -> None:
        self.store = store
        self.protect_inplace = protect_inplace
        self.producers = Producers()

    def before(self, node, args, kwargs, callee):
        inplace = args and isinstance(args[0], torch.Tensor) and is_inplace_call(callee, kwargs)
        # An eager in-place op (ReLU(inplace=True) in a recorded model) would overwrite the value
        # kept for the node that produced its input: keep a copy of that one first.
        if self.protect_inplace and inplace:
            source = self.producers.get(args[0])
            if source is not None:
                kept = self.store.values[source[0]]
                if kept[source[1]] is args[0]:
                    kept[source[1]] = args[0].detach().clone()
        return _widened(args, kwargs, callee, skip_first=inplace)

    def rename(self, node, name) -> None:
        pass

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
            self.producers.add(node.name, tensors(output))
        return output


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


# ----------------------------------------------------------------------------------- sensitivity


class Sensitivity:
    """The float32 run with autograd whose backward passes weight each node's local error."""

    def __init__(self) -> None:
        self.roots: List[torch.Tensor] = []
        self.root_index: List[int] = []  # position of each root among the output's float tensors
        self.leaves: List[torch.Tensor] = []
        self.handles: List[Any] = []
        self._errors: Dict[str, List[Optional[torch.Tensor]]] = {}
        self._acc: Dict[str, torch.Tensor] = {}

    # observer protocol
    def before(self, node, args, kwargs, callee):
        return args, kwargs

    def rename(self, node, name) -> None:
        pass

    def __call__(self, node, args, kwargs, callee, output):
        if node.kind == Kind.OUTPUT:
            return output
        for j, t in enumerate(tensors(output)):
            if t.is_floating_point() and t.requires_grad:
                self.handles.append(hook_gradient(t, partial(self._on_grad, node.name, j)))
        return output

    def _on_grad(self, name: str, index: int, grad: torch.Tensor):
        errors = self._errors.get(name)
        if errors is None or index >= len(errors) or errors[index] is None or grad is None:
            return None
        e = errors[index]
        if e.shape != grad.shape:
            return None
        # one product and one float32 sum per value (errors and gradients need only a few digits)
        term = torch.sum(grad * e, dtype=torch.float32)
        self._acc[name] = self._acc[name] + term if name in self._acc else term
        return None

    def contributions(self, errors: Dict[str, List[Optional[torch.Tensor]]], output_error: List[Optional[torch.Tensor]],
                      norm: torch.Tensor) -> Tuple[List[str], Optional[torch.Tensor]]:
        """(nodes, <J_i e_i, E> / ||E||^2 of each as one vector on the device): ``norm`` is ||E||,
        on the device: reading it back here would stall the GPU; a zero or non-finite norm is
        caught when the figures are read."""
        cotangents = []
        roots = []
        for root, position in zip(self.roots, self.root_index):
            e = output_error[position] if position < len(output_error) else None
            if e is None or e.shape != root.shape:
                continue
            roots.append(root)
            cotangents.append((e / norm).to(root.dtype))
        if not roots:
            return [], None
        self._errors, self._acc = errors, {}
        try:
            torch.autograd.grad(roots, self.leaves, cotangents, retain_graph=True, allow_unused=True)
        finally:
            self._errors = {}
        if not self._acc:
            return [], None
        names = list(self._acc)
        return names, torch.stack([self._acc[name] for name in names]) / norm

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.roots = []
        self.leaves = []


def sensitivity_pass(program: Program, graph, model32: torch.nn.Module, inputs32,
                     autocast: Optional[torch.dtype] = None) -> Sensitivity:
    """Run the float32 model with autograd, hooks on every value. Parameters get no gradient unless
    nothing else reaches the output (token-id models), so each backward costs about one forward.

    ``autocast``: run it under autocast to that dtype. Gradients only weight errors: a few digits
    do, and on a GPU a bfloat16 backward pass costs half a float32 one (its time is in moving
    activations). benchmarks/README.md measures the contributions against exact one-node runs."""
    sens = Sensitivity()
    inputs = Inputs.of(inputs32).map(_with_grad)
    leaves = [v for v in inputs.tensors() if v.requires_grad]
    # parameters the graph reads as values of their own (FX get_attr): their rounding is a node's error
    by_name = dict(model32.named_parameters())
    constants = [by_name[p] for n in graph.nodes if n.kind == Kind.CONSTANT for p in n.params if p in by_name]
    saved = {id(p): p.requires_grad for p in model32.parameters()}
    try:
        for p in model32.parameters():
            p.requires_grad_(False)
        for p in constants:
            p.requires_grad_(True)
        leaves += [p for p in constants]
        with torch.enable_grad(), _autocast(inputs, autocast):
            output = program.run(model32, inputs, sens)
            floats = [t for t in tensors(output) if t.is_floating_point()]
            if not any(t.requires_grad for t in floats):
                # no float input reaches the output (token ids): take the gradient through the weights
                sens.close()
                sens = Sensitivity()
                for p in model32.parameters():
                    p.requires_grad_(p.is_floating_point())
                leaves = [p for p in model32.parameters() if p.requires_grad]
                with _autocast(inputs, autocast):
                    output = program.run(model32, inputs, sens)
                floats = [t for t in tensors(output) if t.is_floating_point()]
        sens.roots = [t for t in floats if t.requires_grad]
        sens.root_index = [i for i, t in enumerate(floats) if t.requires_grad]
        sens.leaves = leaves
    finally:
        for p in model32.parameters():
            p.requires_grad_(saved.get(id(p), p.requires_grad))
    return sens


def _autocast(inputs: Inputs, dtype: Optional[torch.dtype]):
    if dtype is None:
        return contextlib.nullcontext()
    device = next((t.device for t in inputs.tensors()), torch.device("cpu"))
    return torch.autocast(device.type, dtype=dtype)


def _with_grad(value: torch.Tensor) -> torch.Tensor:
    return value.detach().clone().requires_grad_(True) if value.is_floating_point() else value


# ----------------------------------------------------------------------------------------- sweep


class _Slots:
    """Where one node's figures sit in the sweep's Scalars."""

    __slots__ = ("received", "local", "local_zero", "flips", "inputs", "dtype", "note", "local_from_received")

    def __init__(self) -> None:
        self.received: List[Tuple[int, int, int]] = []  # (output index, ||d||_2, ||d||_inf)
        self.local: List[Tuple[int, int, int]] = []
        self.local_zero = False  # moves values only: no local error by construction
        self.local_from_received = False  # enters the graph: its rounding on entry is its local error
        self.flips: List[Tuple[int, int]] = []  # (flipped units slot, units slot)
        self.inputs: List[Tuple[str, int]] = []  # producers of its float inputs
        self.dtype: Optional[str] = None
        self.note: Optional[str] = None


class _Unmatched(Exception):
    pass


class _SweepObserver:
    def __init__(self, run: ModeRun, ref: ReferenceStore, graph, inplace_semantics: bool, keep_errors: bool) -> None:
        self.run = run
        self.ref = ref
        self.graph = graph
        self.inplace_semantics = inplace_semantics
        self.keep_errors = keep_errors
        self.error_dtype = error_dtype(run.device)
        self.producers = Producers()
        self.pending: Optional[list] = None
        self.position = 0
        self.diverged_at: Optional[str] = None
        self.scalars = Scalars()
        self.slots: Dict[str, _Slots] = {}
        self.errors: Dict[str, List[Optional[torch.Tensor]]] = {}

    # ------------------------------------------------------------ observer protocol

    def before(self, node, args, kwargs, callee):
        inplace = self.inplace_semantics and is_inplace_call(callee, kwargs)
        new_args, new_kwargs, decision = self.run.before(node, args, kwargs, callee, inplace=inplace)
        self.pending = [node, args, kwargs, decision]
        return new_args, new_kwargs

    def rename(self, node, name) -> None:
        if self.pending is not None and self.pending[0] is node:
            self.pending[0] = name

    def __call__(self, node, args, kwargs, callee, output):
        pending = self.pending
        if pending is not None and (pending[0] is node or pending[0] == node.name):
            self.pending = None
            orig_args, orig_kwargs, decision = pending[1], pending[2], pending[3]
        else:
            orig_args, orig_kwargs, decision = args, kwargs, None
        output = self.run.entering(node, self.run.after(output, decision))
        if node.kind == Kind.OUTPUT:
            return output
        outs = tensors(output)
        aligned = self._aligned(node)
        if aligned:
            slots = self.slots[node.name] = _Slots()
            self._received(node.name, outs, slots)
            if node.kind in (Kind.DECISION, Kind.COMPARE) or self._has_margins(node.name):
                self._flips(node, outs, slots, orig_args)
            slots.inputs = self._input_producers(orig_args, orig_kwargs)
            self._local(node, orig_args, orig_kwargs, callee, outs, slots)
        self.producers.add(node.name, outs)
        return output

    # ------------------------------------------------------------ helpers

    def _has_margins(self, name: str) -> bool:
        ir = self.graph.get(name)
        return ir is not None and ir.margins is not None

    def _aligned(self, node) -> bool:
        if self.diverged_at is not None:
            return False
        order = self.ref.order
        if self.position < len(order) and order[self.position] == node.name and self.ref.fns[node.name] == node.fn:
            self.position += 1
            return True
        self.diverged_at = node.name
        return False

    def _received(self, name: str, outs: List[torch.Tensor], slots: _Slots) -> None:
        refs = self.ref.values[name]
        for j, (o, r) in enumerate(zip(outs, refs)):
            if not (o.is_floating_point() and r.is_floating_point()):
                continue
            if slots.dtype is None:
                slots.dtype = str(o.dtype).replace("torch.", "")
            if o.shape != r.shape:
                slots.note = f"output {j} has shape {tuple(o.shape)} here and {tuple(r.shape)} in the reference"
                continue
            d = difference(o, r, self.error_dtype, (name, j) in self.ref.nonfinite)
            n2, ninf = self.scalars.norms(d)
            slots.received.append((j, n2, ninf))

    def _flips(self, node, outs: List[torch.Tensor], slots: _Slots, args) -> None:
        refs = self.ref.values[node.name]
        for o, r in zip(outs, refs):
            if o.is_floating_point() or r.is_floating_point():
                continue
            changes = self._nms_changes(node, o, r, args) if node.fn in ("nms", "batched_nms") else None
            if changes is None:
                changes = decision_changes(node, o, r)
            if changes is None:  # not comparable (another number of candidates): no figure rather than a wrong one
                continue
            flipped, units = changes
            slots.flips.append((self.scalars.add(torch.as_tensor(flipped)), self.scalars.add(torch.as_tensor(units))))

    def _nms_changes(self, node, kept: torch.Tensor, reference_kept: torch.Tensor, args):
        """An NMS's changed decisions by the boxes it kept (not their indices into its candidates)."""
        boxes = args[0] if args and isinstance(args[0], torch.Tensor) else None
        reference = self._reference_of(boxes) if boxes is not None else None
        if reference is None or kept.dim() != 1 or reference_kept.dim() != 1 or boxes.dim() != 2:
            return None
        labels = args[2] if node.fn == "batched_nms" and len(args) > 2 and isinstance(args[2], torch.Tensor) else None
        reference_labels = self._reference_of(labels) if labels is not None else None
        if labels is not None and (reference_labels is None or reference_labels.shape[0] != reference.shape[0]):
            labels = reference_labels = None
        return changed_decisions(kept, reference_kept, boxes, reference, labels, reference_labels)

    def _input_producers(self, args, kwargs) -> List[Tuple[str, int]]:
        found = []
        for v in flatten(args, kwargs)[0]:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                source = self.producers.get(v)
                if source is not None and source not in found:
                    found.append(source)
        return found

    def _reference_of(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        source = self.producers.get(t)
        if source is not None:
            values = self.ref.values.get(source[0])
            return values[source[1]] if values is not None and source[1] < len(values) else None
        return self.run.reference_tensors.get(id(t))

    def _reference_args(self, args, kwargs, copy: bool):
        """The node's operands with reference values, each in the dtype it has in this mode's run."""
        flat, rebuild = flatten(args, kwargs)
        out = []
        for v in flat:
            if isinstance(v, torch.Tensor):
                source = self._reference_of(v)
                if source is not None:
                    if source.shape != v.shape:
                        raise _Unmatched(f"an operand has shape {tuple(v.shape)} here and {tuple(source.shape)} in the reference")
                    dtype = self.run.low if id(v) in self.run.low_params else v.dtype
                    v = source.to(dtype=dtype, copy=copy)
            out.append(v)
        return rebuild(out)

    def _exact_args(self, args, kwargs, ref_args, ref_kwargs):
        """Operands for the exact replay: rounded reference values in float32, parameters as the user's."""
        flat, rebuild = flatten(args, kwargs)
        ref_flat, _ = flatten(ref_args, ref_kwargs)
        out = []
        for original, rounded in zip(flat, ref_flat):
            if isinstance(original, torch.Tensor):
                param = self.run.original_tensors.get(id(original))
                if param is not None:
                    out.append(param)
                elif rounded.dtype in REDUCED_FLOATS:
                    out.append(rounded.float())
                else:
                    out.append(rounded)
            else:
                out.append(rounded)
        return rebuild(out)

    def _local(self, node, args, kwargs, callee, outs: List[torch.Tensor], slots: _Slots) -> None:
        name = node.name
        if not any(t.is_floating_point() for t in outs):
            return
        if node.kind in (Kind.INPUT, Kind.CONSTANT) or (callee is None and node.kind != Kind.SHAPE):
            # A value entering the graph (an input, a parameter read as a value, a constant): its
            # rounding on entry is the only error it adds.
            slots.local_from_received = True
            slots.local = list(slots.received)
            if self.keep_errors:
                refs = self.ref.values[name]
                self.errors[name] = [
                    difference(o, refs[j], self.error_dtype, (name, j) in self.ref.nonfinite)
                    if o.is_floating_point() and o.shape == refs[j].shape else None
                    for j, o in enumerate(outs)
                ]
            return
        if node.kind in _NO_REPLAY_KINDS:
            slots.local_zero = node.kind == Kind.SHAPE
            return
        if node.fn in _EXACT_FNS and _keeps_dtype(args, kwargs, outs):
            slots.local_zero = True
            return
        inplace = is_inplace_call(callee, kwargs)
        try:
            ref_args, ref_kwargs = self._reference_args(args, kwargs, copy=inplace)
            run_args, run_kwargs, decision = self.run.before(node, ref_args, ref_kwargs, callee)
            replayed = tensors(self.run.after(invoke(callee, run_args, run_kwargs), decision, replay=True))
            if any(isinstance(v, torch.Tensor) and v.dtype in REDUCED_FLOATS for v in flatten(ref_args, ref_kwargs)[0]):
                exact_args, exact_kwargs = self._exact_args(args, kwargs, ref_args, ref_kwargs)
                exact_callee = self.run.originals.get(id(callee), callee) if isinstance(callee, torch.nn.Module) else callee
                with self.run.exact_context():
                    exact = tensors(invoke(exact_callee, exact_args, exact_kwargs))
            else:
                exact = self.ref.values[name]
        except _Unmatched as exc:
            slots.note = f"local error not measured: {exc}"
            return
        except Exception as exc:  # a node that cannot be called again on its own: say so, measure the rest
            slots.note = f"local error not measured: replaying the node raised {one_line(exc)}"
            return
        kept: List[Optional[torch.Tensor]] = []
        for j, (y, z) in enumerate(zip(replayed, exact)):
            if not (y.is_floating_point() and z.is_floating_point()) or y.shape != z.shape:
                kept.append(None)
                continue
            e = difference(y, z, self.error_dtype, (name, j) in self.ref.nonfinite)
            n2, ninf = self.scalars.norms(e)
            slots.local.append((j, n2, ninf))
            kept.append(e if self.keep_errors else None)
        if self.keep_errors:
            self.errors[name] = kept


def _keeps_dtype(args, kwargs, outs: List[torch.Tensor]) -> bool:
    """Whether every float result has the dtype of the (first) float operand."""
    first = next((v for v in flatten(args, kwargs)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
    return first is not None and all(t.dtype == first.dtype for t in outs if t.is_floating_point())


def decision_changes(node, value: torch.Tensor, reference: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(units whose decision changed, units) for an integer/boolean result of a decision (None when the
    two results cannot be compared unit by unit).

    Units are what PCL301 counts: elements for thresholds and argmax, rows for top-k and sort
    (a row changes when its index set or order does), and for variable-length results (NMS) the
    union of the kept indices, of which the symmetric difference changed (the sweep compares an
    NMS by the boxes it kept where it knows them: detections.changed_decisions).
    """
    device = reference.device
    value = value.to(device)
    fn = node.fn
    if fn in ("nms", "batched_nms", "unique", "nonzero") and value.dim() == 1 and reference.dim() == 1:
        a, b = value.long(), reference.long()
        missing = (~torch.isin(b, a)).sum()
        extra = (~torch.isin(a, b)).sum()
        return missing + extra, torch.as_tensor(reference.numel(), device=device) + extra
    if value.shape != reference.shape:
        # a mask or a ranking over another number of candidates: the units of the two runs do not
        # correspond, so no count of flips would be a measurement
        return None
    if value.numel() == 0:
        zero = torch.zeros((), device=device)
        return zero, zero
    dim = node.attrs.get("dim", -1)
    if fn in ("topk", "sort", "argsort", "msort") and value.dim() > 0 and isinstance(dim, int):
        a, b = value, reference
        if fn == "topk":  # the set of the top k, whatever their order
            a, b = a.sort(dim=dim).values, b.sort(dim=dim).values
        changed = (a != b).any(dim=dim)
        return changed.sum(), torch.as_tensor(changed.numel(), device=device)
    changed = value != reference
    return changed.sum(), torch.as_tensor(changed.numel(), device=device)


class Sweep:
    """The products of one mode's sweep before they are read back."""

    def __init__(self, observer: _SweepObserver, output: Any) -> None:
        self.observer = observer
        self.output = output


def sweep(program: Program, run: ModeRun, ref: ReferenceStore, graph, keep_errors: bool) -> Sweep:
    observer = _SweepObserver(run, ref, graph, inplace_semantics=not program.is_fx, keep_errors=keep_errors)
    with torch.no_grad(), run.context():
        output = program.run(run.variant, run.inputs, observer)
    return Sweep(observer, output)


def plain_run(run: ModeRun):
    """The model as a user runs it under this mode, with nobody watching."""
    with torch.no_grad(), run.context():
        return Inputs.of(run.inputs).call(run.variant)


def output_error(output: Any, ref: ReferenceStore) -> Tuple[List[Optional[torch.Tensor]], List[torch.Tensor]]:
    """(float errors, float reference values) of the model's outputs, in pytree order."""
    outs = [t for t in tensors(output) if t.is_floating_point()]
    refs = [t for t in tensors(ref.output) if t.is_floating_point()]
    matched = detection_tensor_ids(output)  # detections are compared by matching (queue_figures)
    errors = [o.detach().double() - r if o.shape == r.shape and id(o) not in matched else None
              for o, r in zip(outs, refs)]
    return errors, refs


def integer_outputs(output: Any, ref: ReferenceStore) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    matched = detection_tensor_ids(output)
    outs = [t for t in tensors(output) if not t.is_floating_point()]
    refs = [t for t in tensors(ref.output) if not t.is_floating_point()]
    return [(o, r) for o, r in zip(outs, refs) if id(o) not in matched]


# --------------------------------------------------------------------------------------- finish


class Pending:
    """A mode's figures issued on the device and not yet read back (``queue_figures``)."""

    def __init__(self, swept: Sweep, contribution_slots: Dict[str, int], norm_slot: Optional[int], out_slots,
                 tol_slots, flip_slots, tolerance, delta, detections=None) -> None:
        self.swept = swept
        self.detections = detections  # detections.Comparison of the output's detection sets, or None
        self.contribution_slots = contribution_slots
        self.norm_slot = norm_slot
        self.out_slots = out_slots
        self.tol_slots = tol_slots
        self.flip_slots = flip_slots
        self.tolerance = tolerance
        self.delta = delta  # the plain run against the observed one: inf, or [(slot, is_label)]


def queue_figures(swept: Sweep, contributions: Tuple[List[str], Optional[torch.Tensor]],
                  errors: List[Optional[torch.Tensor]], ref_outputs: List[torch.Tensor],
                  tolerance: Optional[Tuple[float, float]], int_pairs, plain: Any = None) -> Pending:
    """Issue the work of the sweep's figures on the device, without waiting for it (``finish`` reads
    them); ``plain``: the output of the plain run, compared with the observed one."""
    obs = swept.observer
    scalars = obs.scalars
    names, values = contributions
    contribution_slots: Dict[str, int] = {}
    norm_slot = None
    if names:
        first = scalars.add_vector(values)
        contribution_slots = {name: first + i for i, name in enumerate(names)}
        norm_slot = scalars.add(torch.sqrt(sum(torch.sum(e.double() * e.double()) for e in errors if e is not None)))
    # detection sets: their matched boxes and scores count as output values (detections.py)
    detections = compare_detections(swept.output, swept.observer.ref.output)
    if detections is not None:
        errors, ref_outputs = errors + detections.errors, ref_outputs + detections.references
    out_slots = []
    for e, r in zip(errors, ref_outputs):
        if e is None:
            continue
        out_slots.append((scalars.norms(e), scalars.norms(r)[0]))
    tol_slots = None
    if tolerance is not None and out_slots:
        tol_slots = _tolerance_slots(errors, ref_outputs, tolerance, scalars)
    flip_slots = []
    for o, r in int_pairs:
        changed = (o.to(r.device) != r) if o.shape == r.shape else torch.ones(max(o.numel(), r.numel()), dtype=torch.bool, device=r.device)
        flip_slots.append((scalars.add(changed.sum()), changed.numel()))
    delta = None if plain is None else _difference_slots(plain, swept.output, scalars)
    scalars.compute()
    return Pending(swept, contribution_slots, norm_slot, out_slots, tol_slots, flip_slots, tolerance, delta, detections)


def _difference_slots(plain: Any, observed: Any, scalars: Scalars):
    """Largest |plain - observed| per output, as slots (inf at once when they differ in shape)."""
    a, b = tensors(plain), tensors(observed)
    if len(a) != len(b):
        return math.inf
    slots = []
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        if x.is_floating_point():
            if not x.numel():
                continue
            both_nan = x.isnan() & y.isnan()
            d = (x.double() - y.double()).abs().masked_fill(both_nan, 0.0)
            d = d.masked_fill(x == y, 0.0)  # equal infinities
            slots.append((scalars.add(d.max()), False))
        else:
            slots.append((scalars.add((x != y).any()), True))
    return slots


def observer_delta(pending: Pending) -> Optional[float]:
    """Largest |plain - observed| over the outputs (inf when they differ in shape or labels)."""
    if pending.delta is None or isinstance(pending.delta, float):
        return pending.delta
    scalars = pending.swept.observer.scalars
    worst = 0.0
    for slot, label in pending.delta:
        if label:
            if scalars[slot]:
                return math.inf
        else:
            worst = max(worst, scalars[slot])
    return worst


def finish(measure: ModeMeasure, pending: Pending, ref: ReferenceStore, graph) -> None:
    """Read the sweep's figures back and fill ``measure``."""
    swept = pending.swept
    obs = swept.observer
    scalars = obs.scalars
    contribution_slots, norm_slot = pending.contribution_slots, pending.norm_slot
    out_slots, tol_slots, flip_slots, tolerance = pending.out_slots, pending.tol_slots, pending.flip_slots, pending.tolerance
    contributions = bool(contribution_slots)
    scalars.resolve()
    measure.observer_delta = observer_delta(pending)

    # the output
    if out_slots:
        sq_err = sum(scalars[s[0][0]] ** 2 for s in out_slots)
        sq_ref = sum(scalars[s[1]] ** 2 for s in out_slots)
        max_abs = max(scalars[s[0][1]] for s in out_slots)
        finite = _finite(sq_err) and _finite(max_abs)
        rel = (sq_err ** 0.5 / sq_ref ** 0.5 if sq_ref > 0 else 0.0) if finite else float("inf")
        measure.output = Figure(rel, max_abs if finite else float("inf"))
        measure.output_finite = finite
    if flip_slots:
        measure.output_flips = int(sum(scalars[s] for s, _ in flip_slots))
        measure.output_units = int(sum(n for _, n in flip_slots))
        if measure.output_finite is None:
            measure.output_finite = True
    if pending.detections is not None:
        changes = measure.detections = pending.detections.changes
        measure.output_flips = (measure.output_flips or 0) + changes.changed
        measure.output_units = (measure.output_units or 0) + changes.units
        if measure.output_finite is None:
            measure.output_finite = True
        if not contributions:
            measure.notes.append("contributions not measured: a detector's boxes are compared by matching, "
                                 "not element by element")
    if tol_slots is not None:
        rtol, atol = tolerance
        failing, numel, min_atol, min_rtol = tol_slots
        measure.tolerance = ToleranceCheck(rtol, atol, int(scalars[failing]), numel, scalars[min_atol],
                                           scalars[min_rtol] if _finite(scalars[min_rtol]) else None)

    # every node
    contributions_valid = contributions and _finite(scalars[norm_slot]) and scalars[norm_slot] > 0
    if contributions and not contributions_valid:
        measure.notes.append("contributions not measured: the output error is zero or not finite")
    explained = 0.0
    any_contribution = False
    received_rel: Dict[Tuple[str, int], Tuple[float, float]] = {}  # (squared error norm, squared ref norm)
    for name in ref.order:
        slots = obs.slots.get(name)
        if slots is None:
            continue
        m = NodeMeasure(dtype=slots.dtype, note=slots.note)
        sq_e = sq_r = 0.0
        max_abs = 0.0
        for j, n2, ninf in slots.received:
            r = ref.norm(name, j) or 0.0
            received_rel[(name, j)] = (scalars[n2] ** 2, r * r)
            sq_e += scalars[n2] ** 2
            sq_r += r * r
            max_abs = max(max_abs, scalars[ninf])
        if slots.received:
            finite = _finite(sq_e) and _finite(max_abs)
            m.received = Figure((sq_e ** 0.5 / sq_r ** 0.5 if sq_r > 0 else 0.0) if finite else float("inf"),
                                max_abs if finite else float("inf"))
            m.nonfinite = not finite  # the same inf as the reference's counts as no error (difference())
            if m.nonfinite and measure.first_nonfinite is None:
                measure.first_nonfinite = name
        if slots.local_zero:
            m.local = Figure(0.0, 0.0)
        elif slots.local:
            sq_l = sum(scalars[n2] ** 2 for _, n2, _ in slots.local)
            sq_lr = sum((ref.norm(name, j) or 0.0) ** 2 for j, _, _ in slots.local)
            max_l = max(scalars[ninf] for _, _, ninf in slots.local)
            finite = _finite(sq_l) and _finite(max_l)
            m.local = Figure((sq_l ** 0.5 / sq_lr ** 0.5 if sq_lr > 0 else 0.0) if finite else float("inf"),
                             max_l if finite else float("inf"))
        if slots.flips:
            m.flips = int(sum(scalars[f] for f, _ in slots.flips))
            m.units = int(sum(scalars[u] for _, u in slots.flips))
        m.amplification = _amplification(m, slots, received_rel)
        if name in contribution_slots and contributions_valid:
            value = scalars[contribution_slots[name]]
            if _finite(value):
                m.contribution = value
                explained += value
                any_contribution = True
        node = graph.get(name)
        if measure.mode == "tf32" and node is not None and node.kind in DOT_PRODUCT_KINDS and m.local is not None:
            m.tf32_applied = _tf32_applied(node, m.local, slots, scalars, ref)
        measure.nodes[name] = m
    if any_contribution:
        measure.explained = explained
    measure.diverged_at = obs.diverged_at


def _amplification(m: NodeMeasure, slots: _Slots, received: Dict[Tuple[str, int], Tuple[float, float]]) -> Optional[float]:
    if m.received is None or m.local is None or slots.local_from_received:
        return None
    sq_e = sum(received[s][0] for s in slots.inputs if s in received)
    sq_r = sum(received[s][1] for s in slots.inputs if s in received)
    if sq_r <= 0 or sq_e <= 0 or not _finite(sq_e) or not _finite(m.received.rel_error):
        return None
    incoming = (sq_e / sq_r) ** 0.5
    passed_on = max(m.received.rel_error ** 2 - (m.local.rel_error or 0.0) ** 2, 0.0) ** 0.5
    return passed_on / incoming


def _tf32_applied(node, local: Figure, slots: _Slots, scalars: Scalars, ref: ReferenceStore) -> Optional[bool]:
    """TF32-sized local error (True) or float32-sized (False), against the size of the summed terms."""
    if local.rel_error is None or not _finite(local.rel_error):
        return None
    numel = node.out.numel if node.out is not None and node.out.numel else None
    terms = node.dot_rms if node.dot_rms else (node.out.rms if node.out is not None else None)
    if not terms or not numel:
        return None
    sq = sum(scalars[n2] ** 2 for _, n2, _ in slots.local)
    local_rms = (sq / numel) ** 0.5
    return local_rms / (C_INPUT * terms) > TF32_THRESHOLD


def _tolerance_slots(errors, refs, tolerance, scalars: Scalars):
    """Elements failing |d| <= atol + rtol |ref|, and the smallest atol (at rtol) and rtol (at atol) that pass."""
    rtol, atol = tolerance
    failing = None
    min_atol = None
    min_rtol = None
    numel = 0
    for e, r in zip(errors, refs):
        if e is None or e.numel() == 0:
            continue
        d = e.abs()
        a = r.abs()
        numel += d.numel()
        fail = (d > atol + rtol * a) | ~torch.isfinite(d)
        need_atol = (d - rtol * a).clamp_min(0).max()
        # where |ref| == 0 no rtol helps an element beyond atol: its need is inf
        over = (d - atol).clamp_min(0)
        need_rtol = torch.where(over > 0, over / a, torch.zeros_like(over)).max()
        failing = fail.sum() if failing is None else failing + fail.sum()
        min_atol = need_atol if min_atol is None else torch.maximum(min_atol, need_atol)
        min_rtol = need_rtol if min_rtol is None else torch.maximum(min_rtol, need_rtol)
    if failing is None:
        return None
    return scalars.add(failing), numel, scalars.add(min_atol), scalars.add(min_rtol)


def _finite(value) -> bool:
    return value is not None and value == value and value not in (float("inf"), float("-inf"))
