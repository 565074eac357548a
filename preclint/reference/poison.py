"""Which elements of the reference run's values come from inf or NaN, where the values cannot show it.

A model may compute inf or NaN at elements it then discards: T5's relative-position buckets take
``log`` of every distance, 0 included, cast the result to integers and keep, with ``torch.where``,
the bucket of a small distance instead. A float value shows its infinities; once cast to an integer
they become ordinary-looking numbers, so the elements that came from them are tracked here (as a
mask per tensor) through the integer ops that follow, until they are dropped (``where``,
``masked_fill``) or reach the output. Whether float infinities reach the output the output's own
values tell.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten

from preclint.core.ir import Kind, Node

# kinds whose output element depends on the input elements at its own position (with broadcasting)
ELEMENTWISE_KINDS = frozenset({Kind.ELEMENTWISE, Kind.ACTIVATION, Kind.CAST, Kind.COMPARE, Kind.OTHER})


def _broadcast(mask: torch.Tensor, shape) -> Optional[torch.Tensor]:
    try:
        return torch.broadcast_to(mask, shape)
    except RuntimeError:
        return None


class PoisonTracker:
    """Masks of the elements computed from inf or NaN, for tensors whose values cannot hold them."""

    def __init__(self, origin=lambda t: t) -> None:
        self.origin = origin  # maps an operand view back to the tensor that stands for it
        self.masks: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}  # id -> (mask, tensor kept alive)

    def mask(self, value) -> Optional[torch.Tensor]:
        if not isinstance(value, torch.Tensor):
            return None
        found = self.masks.get(id(self.origin(value)))
        return found[0] if found is not None else None

    def observe(self, node: Node, args, kwargs, callee, outputs: List[torch.Tensor]) -> None:
        """Masks of the node's outputs, from the masks of its inputs and the infinities of the floats
        it turns into integers."""
        if not outputs or (not self.masks and all(s is None or not s.is_float or s.finite for s in node.input_stats)):
            return
        with torch.no_grad():
            result = self._propagate(node, args, kwargs, callee, outputs[0])
        if result is not None and bool(result.any()):
            for out in outputs:
                if out.shape == result.shape:
                    self.masks[id(out)] = (result, out)
                else:  # further outputs (indices of a max, chunks) are all suspect
                    self.masks[id(out)] = (torch.ones(out.shape, dtype=torch.bool, device=out.device), out)

    def _propagate(self, node: Node, args, kwargs, callee, out: torch.Tensor) -> Optional[torch.Tensor]:
        tensors = [v for v in tree_flatten((args, kwargs))[0] if isinstance(v, torch.Tensor)]
        masks = [(t, self.mask(t)) for t in tensors]
        if not out.is_floating_point() and not out.is_complex() and out.dtype != torch.bool:
            # a float turned into integers: its inf and NaN become arbitrary integers
            masks = [(t, m if not (t.is_floating_point() and not bool(torch.isfinite(t).all()))
                      else (~torch.isfinite(t) if m is None else m | ~torch.isfinite(t))) for t, m in masks]
        if all(m is None for _, m in masks) or node.kind == Kind.CONSTANT:
            return None  # (zeros_like, full_like and the like read a tensor's shape, not its values)
        shape = out.shape
        everything = torch.ones(shape, dtype=torch.bool, device=out.device)
        if node.fn == "where" and len(args) >= 3:
            cond, a, b = args[0], args[1], args[2]
            picked = torch.where(cond if isinstance(cond, torch.Tensor) else torch.tensor(bool(cond)),
                                 self._or_none(a, shape, out.device), self._or_none(b, shape, out.device))
            return picked | self._or_none(cond, shape, out.device)
        if node.fn == "masked_fill" and len(args) >= 2 and isinstance(args[1], torch.Tensor):
            kept = self._or_none(args[0], shape, out.device) & ~torch.broadcast_to(args[1], shape)
            return kept | self._or_none(args[1], shape, out.device)
        if node.kind == Kind.SHAPE and args and callee is not None:
            # moved, not computed: the same op moves the masks (views, reshapes, slices, concatenation)
            moved = self._moved(args, kwargs, callee)
            return moved if isinstance(moved, torch.Tensor) and moved.shape == shape else everything
        if node.kind in ELEMENTWISE_KINDS:
            combined = torch.zeros(shape, dtype=torch.bool, device=out.device)
            for t, m in masks:
                if m is None:
                    continue
                spread = _broadcast(m, shape)
                if spread is None:
                    return everything
                combined = combined | spread
            return combined
        return everything  # a reduction, a product, a lookup: every element may depend on a bad one

    def _moved(self, args, kwargs, callee):
        """The op applied to the masks of its data operand (the first argument, or the tensors of a
        list there), its other arguments (dims, indices) as they were; None where a poisoned tensor
        is one of those other arguments."""
        as_mask = lambda t: self.mask(t) if self.mask(t) is not None else torch.zeros(t.shape, dtype=torch.bool, device=t.device)  # noqa: E731
        first = args[0]
        if isinstance(first, torch.Tensor):
            data = as_mask(first)
        elif isinstance(first, (list, tuple)) and all(isinstance(t, torch.Tensor) for t in first):
            data = type(first)(as_mask(t) for t in first)
        else:
            return None
        rest = [v for v in tree_flatten((args[1:], kwargs))[0] if isinstance(v, torch.Tensor)]
        if any(self.mask(t) is not None for t in rest):
            return None
        try:
            if isinstance(callee, str):
                return getattr(data, callee)(*args[1:], **kwargs)
            return callee(data, *args[1:], **kwargs)
        except (RuntimeError, TypeError, ValueError, IndexError, AttributeError):
            return None

    def _or_none(self, value, shape, device) -> torch.Tensor:
        mask = self.mask(value)
        if mask is None:
            return torch.zeros(shape, dtype=torch.bool, device=device)
        spread = _broadcast(mask, shape)
        return spread if spread is not None else torch.ones(shape, dtype=torch.bool, device=device)

    def clear(self) -> None:
        self.masks.clear()
