"""Figures computed on the device and read back once per pass: ``Scalars`` gathers them, and the
error vectors they are norms of are made by ``difference`` in ``error_dtype``.

A read per node would stall the GPU at every node, and a read per mode would leave it idle while
Python issues the next one; so every figure of a pass is queued here and read back after every mode
has been issued.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch


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
                self._values.append(([slot, slot + 1], _l2_and_largest(t, wide)))
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


def _l2_and_largest(t: torch.Tensor, wide) -> torch.Tensor:
    """[||t||_2, ||t||_inf] on the CPU. The largest magnitude as the larger of -min and max: one
    pass that the CPU vectorises, where vector_norm(t, inf) takes a scalar loop (25 times slower on
    a 64x112x112 value); the same number (NaN where t holds one)."""
    low, high = torch.aminmax(t)
    largest = torch.maximum(-low, high)
    return torch.stack([torch.linalg.vector_norm(t, dtype=wide), largest.to(wide) if wide is not None else largest])


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
    ``same_inf`` (one of them holds inf or NaN): elements that are the same inf (or both NaN) differ
    by 0, not NaN; so do elements where both hold the same fill, the lowest (or highest) value of
    their dtype or that value overflowed to inf (a mask made with ``torch.finfo(dtype).min``, which is
    -1.8e308 in the float64 reference, -inf kept as float32, and -3.4e38 in a float32 run): they are
    the model's masking, selected away, not a rounding error, and no finite difference measures them."""
    out = torch.empty(a.shape, dtype=dtype, device=a.device)
    a, b = a.detach(), b.detach()
    if a.device.type == "cpu" and a.dtype != b.dtype and a.is_floating_point() and b.is_floating_point():
        # the CPU subtracts two dtypes elementwise with a cast per element, three times slower than
        # converting the narrower one first: the same numbers, the difference taken in the wider dtype
        common = torch.promote_types(a.dtype, b.dtype)
        d = torch.sub(a.to(common), b.to(common), out=out)
    else:
        d = torch.sub(a, b, out=out)
    if same_inf:
        same = (a == b) | (a.isnan() & b.isnan())
        if a.is_floating_point() and b.is_floating_point():
            same |= _at_extreme(a) & _at_extreme(b) & ((a > 0) == (b > 0))
        d = d.masked_fill(same, 0.0)
    return d


def _at_extreme(t: torch.Tensor) -> torch.Tensor:
    """Elements at the largest magnitude their dtype holds, or beyond it (inf)."""
    return t.detach().abs() >= torch.finfo(t.dtype).max
