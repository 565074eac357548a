"""Streaming the probe's copies of a model through the device one block at a time.

A model too large for the device in float64 (13B parameters are 104 GB) is still measured by the
same passes, in the same order, with the same kernels: only where the weights live changes. Every
copy the probe makes (float64, float32, each mode's rounded or cast variant) is built with its
tensors *empty* (their storage resized to 0, shape and dtype kept, so that every map between copies
and every decision that reads a shape still holds). When a pass enters a block (a transformer layer,
a stage, any top-level child), that copy's tensors of the block are filled from the user's model
(on the host), converted as the copy wants them, and emptied again when later blocks need the room.
Nothing is computed differently, so the ledger is the unstreamed one.

* Eager runs (function-mode recording, plain runs, modules FX calls): a global forward pre-hook
  fills the block a module call enters; blocks stay filled until ``capacity`` later ones evict them.
* FX runs: the runner fills the block of each node's module path before the node runs.
* Backward passes: autograd's saved-tensor hooks save a reference to a streamed tensor, not its
  memory, and refill it when the backward pass reads it.

Host memory: the user's model, nothing more (each tensor is staged on its way to the device).
Device memory: the activations the passes keep, plus ``capacity`` blocks of each copy in use.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch
from torch import nn

from preclint.core.ir import Kind
from preclint.load.modelio import output_tensors as tensors
from preclint.capture.trees import leaves
from preclint.capture.recorder import unseen
from preclint.measure.copies import clone_module, detached_state, to_device

# A container of layers (not of single ops) is split into its layers; any other module is split into
# its children while it holds more than this share of the model's bytes (a wrapper around the model).
DOMINANT_SHARE = 0.5


def find_blocks(model: nn.Module) -> List[str]:
    """Module paths of the blocks, in module order: the model split, from the top, at its layer
    containers (ModuleList, Sequential, ModuleDict) and at modules holding most of its weights."""
    sizes = _subtree_bytes(model)
    total = sizes[""] or 1
    blocks: List[str] = []

    def visit(path: str, module: nn.Module) -> None:
        children = [(f"{path}.{name}" if path else name, child) for name, child in module.named_children()]
        holding = [(p, c) for p, c in children if sizes.get(p, 0)]
        container = isinstance(module, (nn.ModuleList, nn.Sequential, nn.ModuleDict)) and any(
            next(c.children(), None) is not None for _, c in holding)
        if holding and (container or sizes[path] > DOMINANT_SHARE * total or not path):
            for p, c in holding:
                visit(p, c)
        elif sizes.get(path, 0):
            blocks.append(path)

    visit("", model)
    return blocks


def _subtree_bytes(model: nn.Module) -> Dict[str, int]:
    """Bytes of the tensors under each module path: a tensor two modules share (tied embeddings)
    counts in each, so that the module using it is a block of its own."""
    sizes: Dict[str, int] = {}
    for path, module in model.named_modules(remove_duplicate=False):
        tensors = {id(t): t for t in list(module.parameters()) + list(module.buffers()) if t is not None}
        sizes[path] = sum(t.numel() * t.element_size() for t in tensors.values())
    return sizes


def model_bytes(model: nn.Module) -> int:
    return _subtree_bytes(model)[""]


class _Entry:
    """One streamed tensor of one copy: how to fill it, and how many filled blocks hold it."""

    __slots__ = ("tensor", "make", "nbytes", "holders")

    def __init__(self, tensor: torch.Tensor, make: Callable[[], torch.Tensor]) -> None:
        self.tensor = tensor
        self.make = make
        self.nbytes = tensor.numel() * tensor.element_size()  # contiguous: _empty_like
        self.holders = 0


class WeightStream:
    """The probe's copies of ``source`` on ``device``, filled one block at a time (module docs)."""

    def __init__(self, source: nn.Module, device: torch.device, blocks: Optional[List[str]] = None,
                 capacity: int = 2) -> None:
        self.source = source
        self.device = device
        self.blocks = blocks if blocks is not None else find_blocks(source)
        self.capacity = capacity
        self._source_tensors = _named_tensors(source)
        # by the identity of the storage (which views, Parameters and .data share, and which an
        # entry keeps alive): its entry, or the maker of a tensor made and not yet registered
        self._entries: Dict[int, _Entry] = {}
        self._makers: Dict[int, Callable[[], torch.Tensor]] = {}
        self._block_of_module: Dict[int, Tuple[int, str]] = {}  # id(module in a copy) -> (id(copy), block)
        self._copy_blocks: Dict[Tuple[int, str], List[_Entry]] = {}
        self._companions: Dict[int, List[nn.Module]] = {}  # id(copy) -> copies filled beside it
        self._copies: Dict[int, nn.Module] = {}
        self._filled: List[Tuple[int, str]] = []  # (id(copy), block), oldest first
        self._active: Dict[Tuple[int, str], int] = {}
        self._pinned: List[_Entry] = []
        self.transferred = 0  # bytes filled so far
        self.remade = 0  # bytes made again for backward passes
        self.filled_bytes = 0  # bytes of the streamed tensors filled now, and at most
        self.peak_filled_bytes = 0

    # ------------------------------------------------------------------ building copies

    def block_of(self, path: str) -> Optional[str]:
        """The block a module, parameter or buffer path belongs to (None: the resident rest)."""
        for block in self.blocks:
            if path == block or path.startswith(block + "."):
                return block
        return None

    def copy(self, dtype: Optional[torch.dtype] = None) -> nn.Module:
        """A copy of the source on the device whose floating tensors are ``dtype``: streamed tensors
        empty, the rest (tensors outside every block) filled now."""

        memo = detached_state(self.source)
        for path, t in self._source_tensors.items():
            if id(t) in memo:
                continue
            target = dtype if dtype is not None and t.is_floating_point() else t.dtype
            make = _converter(t, self.device, target)
            if self.block_of(path) is None:
                moved = make()
            else:
                moved = _empty_like(t, self.device, target)
                self._makers[_storage_id(moved)] = make
            if isinstance(t, nn.Parameter):
                moved = nn.Parameter(moved, requires_grad=t.requires_grad)
            memo[id(t)] = moved
        copy = clone_module(self.source, memo)
        self.register(copy)
        return copy

    def derived(self, original: torch.Tensor, change: Callable[[torch.Tensor], Optional[torch.Tensor]]):
        """``change(original)`` for a variant copy: for a streamed ``original``, an empty tensor that
        ``change`` of the filled original fills (None where ``change`` keeps the original)."""
        entry = self._key(original)
        if entry is None:
            return change(original)
        probe = change(torch.empty(original.shape, dtype=original.dtype, device="meta"))
        if probe is None:
            return None
        new = _empty_like(probe, self.device, probe.dtype)
        self._makers[_storage_id(new)] = lambda: change(entry.make())
        return new

    def register(self, copy: nn.Module, base: Optional[nn.Module] = None) -> None:
        """Record the blocks of ``copy`` (made by ``copy`` or, from ``base``, with ``derived``
        tensors) and the empty tensors of each; ``base``'s blocks are filled beside ``copy``'s."""
        self._copies[id(copy)] = copy
        if base is not None and base is not copy:
            self._companions.setdefault(id(copy), []).append(base)
        for path, module in copy.named_modules(remove_duplicate=False):
            block = self.block_of(path) if path else None
            if block is not None:
                self._block_of_module.setdefault(id(module), (id(copy), block))
        for path, t in _named_tensors(copy).items():
            block = self.block_of(path)
            if block is None:
                continue
            known = self._key(t)
            if known is None:
                make = self._makers.pop(_storage_id(t), None)
                if make is None:
                    continue  # a tensor this copy does not stream
                known = _Entry(t, make)
                self._entries[_storage_id(t)] = known
            entries = self._copy_blocks.setdefault((id(copy), block), [])
            if known not in entries:
                entries.append(known)

    def _key(self, t: torch.Tensor) -> Optional[_Entry]:
        try:
            with unseen():
                return self._entries.get(_storage_id(t))
        except (RuntimeError, NotImplementedError, TypeError):  # tensors without storage
            return None

    def forget(self, copy: nn.Module) -> None:
        """``copy`` is no longer used: empty its blocks and drop its entries."""
        for key in [k for k in self._filled if k[0] == id(copy)]:
            self._empty(key)
        for key in [k for k in self._copy_blocks if k[0] == id(copy)]:
            for entry in self._copy_blocks.pop(key):
                if not any(entry in entries for entries in self._copy_blocks.values()):
                    self._entries.pop(_storage_id(entry.tensor), None)
        self._block_of_module = {m: v for m, v in self._block_of_module.items() if v[0] != id(copy)}
        self._copies.pop(id(copy), None)
        self._companions.pop(id(copy), None)

    # ------------------------------------------------------------------ filling

    def enter(self, copy_id: int, block: str) -> None:
        """Fill ``block`` of the copy (and of its companions) and keep it while it runs."""
        for key in [(copy_id, block)] + [(id(c), block) for c in self._companions.get(copy_id, ())]:
            self._active[key] = self._active.get(key, 0) + 1
            if key in self._filled:
                self._filled.remove(key)
                self._filled.append(key)
                continue
            self._evict(keep=key)
            for entry in self._copy_blocks.get(key, ()):
                if entry.holders == 0:
                    self._fill(entry)
                entry.holders += 1
            self._filled.append(key)

    def leave(self, copy_id: int, block: str) -> None:
        for key in [(copy_id, block)] + [(id(c), block) for c in self._companions.get(copy_id, ())]:
            if self._active.get(key, 0) > 0:
                self._active[key] -= 1

    def _evict(self, keep) -> None:
        # room first, then the new block: at most ``capacity`` blocks per copy are ever filled
        same_copy = [k for k in self._filled if k[0] == keep[0]]
        while len(same_copy) >= self.capacity:
            idle = next((k for k in same_copy if not self._active.get(k)), None)
            if idle is None:
                return
            self._empty(idle)
            same_copy.remove(idle)

    def _empty(self, key) -> None:
        self._filled.remove(key)
        self._active.pop(key, None)
        with unseen():
            for entry in self._copy_blocks.get(key, ()):
                entry.holders -= 1
                if entry.holders == 0 and entry not in self._pinned:
                    self._release(entry)

    def _fill(self, entry: _Entry) -> None:
        # unseen by an eager recording of the run (its TorchFunctionMode), and by autograd
        with unseen():
            storage = entry.tensor.untyped_storage()
            if storage.nbytes() == entry.nbytes:
                return  # still filled: pinned, or held by another copy's block
            value = entry.make()
            storage.resize_(entry.nbytes)
            entry.tensor.data.copy_(value)
        self.transferred += entry.nbytes
        self.filled_bytes += entry.nbytes
        self.peak_filled_bytes = max(self.peak_filled_bytes, self.filled_bytes)

    def empty_all(self) -> None:
        """Empty every filled block (between passes that use other copies)."""
        for key in list(self._filled):
            self._empty(key)
        pinned, self._pinned = self._pinned, []
        with unseen():
            for entry in pinned:
                if entry.holders == 0:
                    self._release(entry)

    def _release(self, entry: _Entry) -> None:
        storage = entry.tensor.untyped_storage()
        if storage.nbytes():
            storage.resize_(0)
            self.filled_bytes -= entry.nbytes

    def fill_operands(self, args, kwargs, callee) -> None:
        """Fill (for the rest of the run) any empty streamed tensor an op is about to read outside
        its block: a weight the model's code reads from elsewhere."""
        # (the observers call this with the recording paused: reading storages records nothing; the
        # streams' own ops, filling a tensor, are hidden. Hiding every op's check cost 0.1 ms an op.)
        operands = [v for v in leaves((args, kwargs)) if isinstance(v, torch.Tensor)]
        if isinstance(callee, nn.Module):
            operands += list(callee.parameters(recurse=False)) + list(callee.buffers(recurse=False))
        for t in operands:
            if t.numel() and t.untyped_storage().nbytes() == 0:
                self.pin(t)

    def pin(self, t: torch.Tensor) -> None:
        """Keep ``t`` filled until ``empty_all`` (a parameter FX reads as a value of its own)."""
        entry = self._key(t)
        if entry is not None and entry not in self._pinned:
            self._fill(entry)
            self._pinned.append(entry)

    # ------------------------------------------------------------------ hooks

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """Module calls fill their blocks, and backward passes refill what they read."""
        from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

        def pre(module, args):
            found = self._block_of_module.get(id(module))
            if found is not None:
                self.enter(*found)

        def post(module, args, output):
            found = self._block_of_module.get(id(module))
            if found is not None:
                self.leave(*found)

        handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        try:
            with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
                yield
        finally:
            for h in handles:
                h.remove()
            self.empty_all()

    def _pack(self, t: torch.Tensor):
        if not isinstance(t, torch.Tensor):
            return t
        entry = self._key(t)
        if entry is None:
            entry = self._cast_of(t)
            if entry is None:
                # detached: a saved output kept as itself would hold its own grad_fn, a cycle through
                # autograd's C++ that no collection frees (with the stream and every copy it reaches)
                # when the graph is not freed by a backward pass; autograd restores the history on unpack
                with unseen():
                    return t.detach()
        with unseen():
            return _Saved(entry, t.size(), t.stride(), t.storage_offset(), t.dtype)

    def _cast_of(self, t: torch.Tensor) -> Optional[_Entry]:
        """The entry a tensor is a plain cast of, or a view of such a cast (autocast's bfloat16 copy
        of a weight that requires gradients, transposed for a matmul): saved as the same view of the
        cast of the refilled weight, not kept (half the model's memory)."""
        fn = t.grad_fn
        while fn is not None and type(fn).__name__ in _VIEW_BACKWARDS and t._is_view():
            fn = fn.next_functions[0][0] if len(fn.next_functions) == 1 else None
        if fn is None or type(fn).__name__ != "ToCopyBackward0" or len(fn.next_functions) != 1:
            return None
        source = getattr(fn.next_functions[0][0], "variable", None)
        return None if source is None else self._key(source)

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        self.remade += saved.entry.nbytes
        with unseen():
            value = saved.entry.make().to(saved.dtype)
            return value.reshape(-1).as_strided(saved.size, saved.stride, saved.offset)

    def observing(self, observer, root: nn.Module):
        """``observer`` for a run of ``root`` (a registered copy) whose blocks the graph's nodes fill."""
        return _FillingObserver(self, observer, id(root))


# backward nodes of ops that return a view of their only tensor operand
_VIEW_BACKWARDS = frozenset({"TBackward0", "TransposeBackward0", "PermuteBackward0", "ViewBackward0",
                             "UnsafeViewBackward0", "ExpandBackward0", "AliasBackward0"})


class _Saved:
    __slots__ = ("entry", "size", "stride", "offset", "dtype")

    def __init__(self, entry, size, stride, offset, dtype) -> None:
        self.entry, self.size, self.stride, self.offset, self.dtype = entry, size, stride, offset, dtype


class _FillingObserver:
    """An observer that fills each node's block before the node runs, then hands over to ``inner``.

    FX runs call leaf modules and functions, never the blocks themselves, so the module hook of
    ``WeightStream.active`` does not see them; the node's module path does. A parameter FX reads as
    a value of its own (``get_attr``) stays filled for the rest of the run: its consumers may sit in
    other blocks. Eager recordings name their nodes only after the call (no module path before it):
    there the module hook fills the blocks."""

    def __init__(self, stream: WeightStream, inner, copy_id: int) -> None:
        self.stream = stream
        self.inner = inner
        self.copy_id = copy_id
        self.current: Optional[str] = None

    def before(self, node, args, kwargs, callee):
        block = self.stream.block_of(node.module_path) if node.module_path else None
        if block is not None and block != self.current:
            if self.current is not None:
                self.stream.leave(self.copy_id, self.current)
            self.stream.enter(self.copy_id, block)
            self.current = block
        self.stream.fill_operands(args, kwargs, callee)
        return self.inner.before(node, args, kwargs, callee)

    def rename(self, node, name) -> None:
        self.inner.rename(node, name)

    def __call__(self, node, args, kwargs, callee, output):
        if node.kind == Kind.CONSTANT:
            for t in tensors(output):
                self.stream.pin(t)
        return self.inner(node, args, kwargs, callee, output)

    def __getattr__(self, name):
        return getattr(self.inner, name)



def _storage_id(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _named_tensors(model: nn.Module) -> Dict[str, torch.Tensor]:
    found = dict(model.named_parameters(remove_duplicate=False))
    found.update({k: v for k, v in model.named_buffers(remove_duplicate=False) if v is not None})
    return found


def _empty_like(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of ``t``'s shape and strides in ``dtype`` on ``device`` whose storage is empty."""
    out = torch.empty(t.shape, dtype=dtype, device=device)  # made and emptied: one tensor at a time
    out.untyped_storage().resize_(0)
    return out


def _converter(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Callable[[], torch.Tensor]:
    """The source tensor on the device in ``dtype``, made anew at each call (staged, not kept)."""

    def make() -> torch.Tensor:
        return to_device(t, device, dtype)

    return make
