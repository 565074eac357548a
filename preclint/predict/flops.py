"""How much arithmetic a dot product holds: what the scaled-format rules weigh a layer by, and what
the plan's scaled exports report as the share of the model they convert."""
from __future__ import annotations

from typing import Dict

from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Node


def flops(node: Node) -> float:
    """Multiply-adds of a dot product: its outputs times its reduction length."""
    if node.out is None or node.kind not in DOT_PRODUCT_KINDS:
        return 0.0
    return float(node.out.numel) * float(node.reduction_length or 1)


def flop_shares(graph: Graph) -> Dict[str, float]:
    """Each dot product's share of the model's dot-product multiply-adds."""
    counts = {n.name: flops(n) for n in graph.nodes if n.kind in DOT_PRODUCT_KINDS}
    total = sum(counts.values())
    return {name: count / total for name, count in counts.items()} if total > 0 else {}
