"""Ties float32's own rounding made: a probability (softmax, sigmoid) or an exp whose results are equal
in float32 where its inputs were not.

A random-init SSDlite's class logits are of order 1e-18 (its activations vanish through the
backbone): every softmax result rounds to 1/91 in float32, while float64 still orders them. A
detector's top-k, NMS and sort then choose among exact float32 ties by index, and the float64
reference by the values float32 could not hold: every detection differs from the reference, under
every precision, since every precision computes these scores in float32 at least. Such ties are no
property of the input (equal inputs give equal results in any format, and results float64 rounds alike
too are ties there as well); they are float32's rounding, and a decision reading them goes either way
against float64 (the error model's ``ties_flip``). The op is run again in float64 on its float32
inputs to tell which results float32 alone made equal.

The record stands on the op that collapsed the values; a decision finds it upstream of what it reads
(``rounding_made_ties``), through ops that only move or select values.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional

from preclint.capture.observer import Call
from preclint.core.ir import Graph, Kind, Node
from preclint.reference.analyses import ForwardAnalysis

if TYPE_CHECKING:
    import torch

COLLAPSING_FNS = frozenset({"softmax", "sigmoid", "exp"})
# Ops a decision's input may pass through from a collapsing op and keep its ties: they move, select or
# gather values (getitem, cat, reshape: Kind.SHAPE; the values of a top-k or sort: Kind.DECISION).
TIE_KEEPING_KINDS = frozenset({Kind.SHAPE, Kind.DECISION})
TIE_KEEPING_FNS = frozenset({"where", "masked_fill", "clamp", "clamp_min", "clamp_max", "clip", "identity",
                             "dropout", "flatten", "contiguous", "clone", "detach", "max", "min", "amax", "amin",
                             "maximum", "minimum", "sort", "topk", "kthvalue", "gather", "index_select", "take",
                             "masked_select"})
MAX_WALK = 4096  # nodes visited upstream of one decision at most


@dataclass
class RoundedTies:
    """Of a collapsing op's results: how many equal another one in float32 where the op in float64
    tells them apart (``rounded``), out of ``values``."""

    rounded: int
    values: int

    @property
    def fraction(self) -> float:
        return self.rounded / self.values if self.values else 0.0


def rounded_tie_count(results: "torch.Tensor", exact: "torch.Tensor") -> int:
    """Results equal to their neighbour in value order where the same op in float64 (``exact``, of the
    same inputs) tells them apart."""
    import torch

    r, e = results.detach().flatten(), exact.detach().flatten()
    if r.numel() < 2 or r.numel() != e.numel():
        return 0
    order = torch.argsort(r, stable=True)
    r, e = r[order], e[order]
    return int(((r[1:] == r[:-1]) & (e[1:] != e[:-1])).sum())


def in_float64(fn: str, x: "torch.Tensor", dim) -> "torch.Tensor":
    x = x.detach().double()
    if fn == "softmax":
        return x.softmax(dim=dim)
    return x.sigmoid() if fn == "sigmoid" else x.exp()


class RoundedTiesAnalysis(ForwardAnalysis):
    record = RoundedTies

    def observe(self, node: Node, call: Call) -> None:
        import torch

        if node.fn not in COLLAPSING_FNS or not call.args or not call.outputs:
            return
        x, y = call.args[0], call.outputs[0]
        if not (isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) and x.is_floating_point()
                and y.is_floating_point() and x.shape == y.shape and y.numel() > 1 and y.dtype != torch.float64):
            return
        dim = call.kwargs.get("dim", call.args[1] if len(call.args) > 1 else node.attrs.get("dim", -1))
        if node.fn == "softmax" and not isinstance(dim, int):
            return
        rounded = rounded_tie_count(y, in_float64(node.fn, x, dim))
        if rounded:
            node.put(RoundedTies(rounded, y.numel()))


def rounding_made_ties(graph: Graph, node: Node, deciding: int,
                       cache: Optional[Dict[str, Optional[Node]]] = None) -> Optional[Node]:
    """The collapsing op whose rounding-made ties reach the ``deciding`` input of decision ``node``
    through ops that keep ties (TIE_KEEPING_KINDS, TIE_KEEPING_FNS); None where none does."""
    if len(node.inputs) <= deciding:
        return None
    start = node.inputs[deciding]
    if cache is not None and start in cache:
        return cache[start]
    found, seen, stack = None, set(), [start]
    while stack and len(seen) < MAX_WALK:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        upstream = graph.get(name)
        if upstream is None:
            continue
        if upstream.record(RoundedTies) is not None:
            found = upstream
            break
        if upstream.kind in TIE_KEEPING_KINDS or upstream.fn in TIE_KEEPING_FNS:
            stack.extend(upstream.inputs)
    if cache is not None:
        cache[start] = found
    return found
