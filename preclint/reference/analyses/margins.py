"""Decision margins: per decision unit (a row of an argmax, a comparison, a pair of NMS scores), how far
the deciding values are from changing the outcome; and for roundings to integers (casts, round,
floor, ceil, trunc), how far each value is from the boundary where its integer changes. Flips are
predicted from them and the error that reaches the decision."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional

from preclint.reference.analyses import ForwardAnalysis
from preclint.capture.observer import Call
from preclint.core.ir import Kind, Node
from preclint.reference.analyses._nms_swaps import swap_margins

if TYPE_CHECKING:
    import torch

MAX_MARGINS = 4096  # margins kept per node (subsampled deterministically beyond that)
ROUNDING_FNS = frozenset({"round", "floor", "ceil", "trunc"})
# Below this magnitude float32 values are 2^-10 apart or closer, so a continuous value lands on a whole
# number by chance once in a thousand at most; beyond 2^23 every float32 value is one.
EXACT_BELOW = 2.0 ** 13


@dataclass
class Margins:
    """How far the values a node decides on are from changing the outcome."""

    values: List[float]  # at most MAX_MARGINS, a deterministic sample of ``units`` beyond that
    units: int  # how many decisions (or rounded values) the margins stand for


# The operand a decision decides on, where it is not the first: NMS orders its boxes (operand 0) by
# their scores (operand 1), and its margins are score gaps, so the error that flips it is the scores'.
DECIDING_OPERAND = {"nms": 1, "batched_nms": 1}
# How far down the score order NMS margins look for an overlapping box: an order swap with a box
# further away needs a larger score gap than with the ones in between.
NMS_WINDOW = 8


def deciding_input(node: Node) -> int:
    """The position among ``node.inputs`` of the value the decision decides on."""
    position = DECIDING_OPERAND.get(node.fn, 0)
    return position if position < len(node.inputs) else 0


class DecisionMargins(Margins):
    """A decision's margins: top-1 minus top-2 per row, the gaps of a sort, or the distance to a threshold."""


class RoundingMargins(Margins):
    """A rounding to integers: each value's distance to the boundary where its integer changes."""


def sampled(margins: torch.Tensor, kind: type) -> Margins:
    """The margins as a record: all of them up to MAX_MARGINS, every n-th beyond."""
    units = int(margins.numel())
    if units > MAX_MARGINS:
        margins = margins[:: math.ceil(units / MAX_MARGINS)]
    return kind([float(m) for m in margins], units)


class DecisionMarginsAnalysis(ForwardAnalysis):
    record = DecisionMargins

    def observe(self, node: Node, call: Call) -> None:
        if node.kind in (Kind.DECISION, Kind.COMPARE) or (node.fn in ("max", "min") and "dim" in node.attrs):
            margins = decision_margins(node, call.args, call.kwargs)
            if margins is not None and margins.numel():
                node.put(sampled(margins, DecisionMargins))


class RoundingMarginsAnalysis(ForwardAnalysis):
    record = RoundingMargins

    def observe(self, node: Node, call: Call) -> None:
        if node.kind == Kind.CAST or node.fn in ROUNDING_FNS:
            margins = rounding_margins(node, call.args, call.outputs[0] if call.outputs else None)
            if margins is not None and margins.numel():
                node.put(sampled(margins, RoundingMargins))


def first_tensor(values) -> Optional[torch.Tensor]:
    import torch
    from torch.utils._pytree import tree_flatten

    for v in tree_flatten(values)[0]:
        if isinstance(v, torch.Tensor):
            return v
    return None


def rounding_margins(node: Node, args, output) -> Optional[torch.Tensor]:
    """Distance of each value to the boundary where its integer changes (a cast to an integer dtype
    truncates, so integers are the boundaries; round's boundaries are the half-integers)."""
    import torch

    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or not isinstance(output, torch.Tensor):
        return None
    to_int = not output.is_floating_point() and output.dtype != torch.bool
    if not (to_int or node.fn in ROUNDING_FNS):
        return None
    v = x.detach().double().flatten()
    v = v[torch.isfinite(v)]
    if node.fn == "round":
        return (0.5 - (v - v.round()).abs()).abs()
    distance = (v - v.round()).abs()
    # A value that is a whole number already, where float32 still holds fractions, came from exact
    # arithmetic (a clamp's bound: a box width clamped to 1 pixel, a ReLU's zero, a count, a size):
    # the error of the continuous values around it does not reach it, and its integer does not move.
    pinned = (distance == 0) & (v.abs() < EXACT_BELOW)
    return torch.where(pinned, torch.full_like(distance, math.inf), distance)


def nms_margins(fn: str, args, kwargs) -> Optional[torch.Tensor]:
    """Per box, the smallest score gap of a swap in score order that changes the box's outcome by
    position (_nms_swaps.py): swapping two boxes that overlap beyond the IoU threshold (of the same
    class, for batched_nms) keeps the other one in the same place, which changes no detection; what
    it suppresses or lets through in turn does. Swaps are sought within NMS_WINDOW places in score
    order. Two boxes that are the same box with the same score were computed alike, and their errors
    are alike too: no swap. (A box whose IoU with a kept one lies near the threshold flips on the
    boxes' error, which these margins, in score units, do not count.)"""
    import torch

    boxes = args[0] if args else kwargs.get("boxes")
    scores = args[1] if len(args) > 1 else kwargs.get("scores")
    if not isinstance(scores, torch.Tensor) or scores.numel() < 2:
        return None
    s, order = scores.detach().double().cpu().sort(descending=True, stable=True)
    if not isinstance(boxes, torch.Tensor) or boxes.dim() != 2 or boxes.shape[0] != scores.numel():
        return (s[:-1] - s[1:]).abs()
    threshold_at, classes_at = (3, 2) if fn == "batched_nms" else (2, None)
    threshold = args[threshold_at] if len(args) > threshold_at else kwargs.get("iou_threshold")
    if not isinstance(threshold, (int, float)):
        return (s[:-1] - s[1:]).abs()
    classes = args[classes_at] if classes_at is not None and len(args) > classes_at else kwargs.get("idxs")
    b = boxes.detach().double().cpu()[order]
    c = classes.detach().cpu()[order] if isinstance(classes, torch.Tensor) and classes.numel() == s.numel() else None
    n = s.numel()
    pairs = []
    for offset in range(1, min(NMS_WINDOW, n - 1) + 1):
        a, z = b[:-offset], b[offset:]
        overlaps = paired_iou(a, z) > threshold
        if c is not None:
            overlaps &= c[:-offset] == c[offset:]
        gap = s[:-offset] - s[offset:]
        alike = (gap == 0) & (a == z).all(dim=-1)
        for k in torch.nonzero(overlaps & ~alike).flatten().tolist():
            pairs.append((k, k + offset, float(gap[k])))
    if c is not None:
        # batched NMS's own trick: boxes of different classes set apart so that they never overlap
        b = b + (c.double() * (float(b.max() - b.min()) + 1.0))[:, None]
    margins = swap_margins(b, pairs, float(threshold))
    return margins.to(scores.device)


def paired_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of each box of ``a`` (N, 4: x1 y1 x2 y2) with the box of ``b`` in the same row."""
    import torch

    wh = (torch.min(a[:, 2:], b[:, 2:]) - torch.max(a[:, :2], b[:, :2])).clamp(min=0)
    inter = wh[:, 0] * wh[:, 1]
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    union = area_a + area_b - inter
    return torch.where(union > 0, inter / union.clamp(min=1e-300), torch.zeros_like(union))


def decision_margins(node: Node, args, kwargs) -> Optional[torch.Tensor]:
    """Per decision unit, how far the deciding values are from changing the outcome."""
    import torch

    x = first_tensor(args)
    if x is None or not x.is_floating_point() or x.numel() == 0:  # nothing to decide (no detections)
        return None
    x = x.detach().double()
    fn = node.fn
    if node.kind == Kind.COMPARE:
        other = args[1] if len(args) > 1 else kwargs.get("other")
        if isinstance(other, torch.Tensor):
            other = other.detach().double()
        elif not isinstance(other, (int, float)):
            return None
        margins = (x - other).abs().flatten()
        # A value that is exactly 0 came from exact arithmetic (a box clipped to the image on both
        # sides has width 0, a ReLU's zero, equal values subtracted): it carries no error of its own
        # continuous neighbours, and its comparison with a threshold apart from 0 does not move.
        zero = x.flatten() == 0
        if isinstance(other, torch.Tensor):
            apart = (other.expand_as(x).flatten() != 0) if other.numel() in (1, x.numel()) else torch.zeros_like(zero)
        else:
            apart = torch.full_like(zero, other != 0)
        pinned = zero & apart
        return torch.where(pinned, torch.full_like(margins, math.inf), margins)
    dim = node.attrs.get("dim")
    if fn in ("nms", "batched_nms"):
        return nms_margins(fn, args, kwargs)
    if fn in ("argmax", "argmin", "max", "min", "topk", "sort", "argsort", "kthvalue", "msort"):
        if fn in ("max", "min") and dim is None:
            return None  # the value of a full reduction; no index decision
        rows = x.flatten() if dim is None else x.movedim(dim if isinstance(dim, int) else dim[0], -1)
        rows = rows.reshape(-1, rows.shape[-1])
        if rows.shape[-1] < 2:
            return None
        ordered = rows.sort(dim=-1, descending=fn not in ("argmin", "min")).values
        gaps = (ordered[:, :-1] - ordered[:, 1:]).abs()
        if fn in ("argmax", "argmin", "max", "min"):
            return gaps[:, 0]
        if fn == "topk":
            # which k values are chosen, not their order (detectors sort what they keep again, a
            # mixture of experts sums its chosen experts): the gap between the k-th and the next
            k = node.attrs.get("k", 1)
            return gaps[:, k - 1] if 0 < k <= gaps.shape[-1] else None
        return gaps.min(dim=-1).values
    return None
