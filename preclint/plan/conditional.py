"""Inputs and parameters a cast model can keep in float32 only together with the ops that read them.

A functional conv or matmul (``F.conv2d(x, self.weight)``, or a bare ``nn.Conv2d`` traced through its
forward) takes its operands' dtypes as given: a float32 weight beside a float16 activation raises, so
the weight alone cannot be kept (plan/units.py's ``promotes``). Kept as an op unit, the op runs in
float32 with its operands upcast (policy.py's ``_run_float32``), and then a float32 weight is what
it reads: keeping the weight as well removes its float16 rounding, which in a patch embedding is
most of the error (PCL900: 55%). Without this, the plan kept the conv (100% of the FLOPs) and still
failed.
"""
from __future__ import annotations

from typing import Dict, FrozenSet, List

from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.core.numerics import Mode
from preclint.plan.units import NO_PROMOTION, is_model_tensor, unit_of


def _readers(graph: Graph, node: Node) -> List[Node]:
    """The ops that read ``node``'s value, through views and indexing."""
    readers: Dict[str, List[Node]] = {}
    for n in graph.nodes:
        for i in n.inputs:
            readers.setdefault(i, []).append(n)
    found, frontier, seen = [], [node.name], set()
    while frontier:
        for reader in readers.get(frontier.pop(), []):
            if reader.name in seen:
                continue
            seen.add(reader.name)
            if reader.kind == Kind.SHAPE:
                frontier.append(reader.name)
            else:
                found.append(reader)
    return found


def conditional_units(graph: Graph, mode: Mode) -> Dict:
    """unit -> the names of the ops that must run in float32 for the unit (a cast model's input or
    parameter) to be kept in float32: the dot products and other ops that do not promote which read
    it outside a module call. Units read by a module call are not conditional (keeping the module
    keeps its parameters, and it casts what it reads)."""
    if mode.autocast:
        return {}
    found: Dict = {}
    for node in graph.nodes:
        if node.out is None or not node.out.is_float or not (node.kind == Kind.INPUT or is_model_tensor(node)):
            continue
        readers = _readers(graph, node)
        if any(r.target.startswith("nn.") for r in readers):
            continue
        strict: FrozenSet[str] = frozenset(r.name for r in readers if r.kind in DOT_PRODUCT_KINDS or r.fn in NO_PROMOTION)
        if strict:
            found[unit_of(node, mode)] = strict
    return found
