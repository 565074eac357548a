"""The values autograd saves during the reference pass, kept as they were when saved, so that the backward
passes run on a model that writes a tensor in place after an op read it.

A recurrence that stores its state in place (``state.copy_(h)``, ``state[:, i] = h``, transformers'
RWKV storing each layer's running sums) overwrites a tensor the previous step's matmul saved for its
gradient. Autograd refuses such a backward pass ("modified by an inplace operation"), and every gain
was lost: the prediction fell back to carrying each rounding to the output unamplified, which over a
contracting recurrence said 3-4x the error the model has. Here autograd saves through hooks: a saved
tensor is kept as it is (no copy), and copied only when the observer sees a write into its memory
coming (``protect``, as the reference pass keeps its own watched values). A write the observer did not
see (inside a module) still fails the pass, as autograd would have.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from preclint.capture.recorder import unseen


class _Saved:
    """One tensor autograd saved: detached (a saved output kept with its history would hold its own
    grad_fn, a cycle through autograd's C++ that no collection frees), sharing its version counter."""

    __slots__ = ("value", "version", "snapshot")

    def __init__(self, value: torch.Tensor) -> None:
        self.value = value
        self.version = value._version
        self.snapshot: Optional[torch.Tensor] = None


class SavedValues:
    def __init__(self) -> None:
        self.by_storage: Dict[Tuple[int, Any], List[_Saved]] = {}

    @contextlib.contextmanager
    def saving(self) -> Iterator[None]:
        """Autograd saves through this registry for the while (the model's forward)."""
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield

    def protect(self, target: torch.Tensor) -> None:
        """Copy every saved tensor that shares memory with ``target`` before a write into it."""
        key = _storage_key(target)
        for saved in self.by_storage.get(key, ()) if key is not None else ():
            if saved.snapshot is None and saved.value._version == saved.version:
                with unseen():
                    saved.snapshot = saved.value.clone()

    def clear(self) -> None:
        self.by_storage.clear()

    def _pack(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.is_inference():
            return t  # (no version counter to tell a write by)
        with unseen():
            saved = _Saved(t.detach())
        key = _storage_key(t)
        if key is not None:
            self.by_storage.setdefault(key, []).append(saved)
        return saved

    @staticmethod
    def _unpack(saved: Any) -> Any:
        if not isinstance(saved, _Saved):
            return saved
        if saved.snapshot is not None:
            return saved.snapshot
        if saved.value._version != saved.version:
            raise RuntimeError("one of the variables needed for gradient computation has been modified by an "
                               f"inplace operation: {tuple(saved.value.shape)} at version {saved.value._version}; "
                               f"expected version {saved.version} instead")
        return saved.value


def _storage_key(t: torch.Tensor) -> Optional[Tuple[int, Any]]:
    try:
        return t.untyped_storage().data_ptr(), t.device
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without storage (subclasses, meta)
        return None

