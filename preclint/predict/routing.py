"""Mixture-of-experts routers: a top-k over the scores a linear layer gives each token (or their softmax
or sigmoid) chooses the experts that token goes to. The top-k is a decision like any other (its
margins are the gap between the k-th and the next score, predict/error_model.py predicts its flips),
but its flips mean something a user must hear even when they are rare: a flipped route sends a token
through another expert, whose output differs by far more than rounding. So every router gets one
line with its predicted flip rate, flagged by PCL301 or not."""
from __future__ import annotations

from typing import Callable, Dict, List, Optional

from preclint.core.findings import percent
from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node
from preclint.reference.analyses.margins import DecisionMargins

# what may stand between the router's linear layer and its top-k
SCORE_FNS = frozenset({"softmax", "sigmoid", "log_softmax", "float", "to", "type_as"})


def _scores_source(graph: Graph, node: Node) -> Optional[Node]:
    """The dot product whose scores ``node`` reads, through reshapes, casts and a softmax/sigmoid."""
    current = graph.get(node.inputs[0]) if node.inputs else None
    for _ in range(8):
        if current is None:
            return None
        if current.kind in DOT_PRODUCT_KINDS:
            return current
        if current.kind not in (Kind.SHAPE, Kind.CAST, Kind.SOFTMAX) and current.fn not in SCORE_FNS:
            return None
        current = graph.get(current.inputs[0]) if current.inputs else None
    return None


def routers(graph: Graph) -> List[Node]:
    """The top-k nodes that choose among a linear layer's per-token scores over their last dimension
    (a mixture of experts' router): k smaller than the number of experts, at most 1024 of them."""
    found = []
    for node in graph.nodes:
        if node.fn != "topk" or node.record(DecisionMargins) is None or not node.input_stats:
            continue
        scores = node.input_stats[0]
        dim = node.attrs.get("dim", -1)
        if scores is None or len(scores.shape) < 2 or dim not in (-1, len(scores.shape) - 1):
            continue
        experts, k = scores.shape[-1], node.attrs.get("k", 1)
        if not (isinstance(k, int) and 0 < k < experts <= 1024):
            continue
        if _scores_source(graph, node) is not None and _used_inside(graph, node):
            found.append(node)
    return found


def _used_inside(graph: Graph, node: Node) -> bool:
    """Whether the model computes on with the top-k (it picks experts), rather than returning it (a
    classifier's top-5)."""
    frontier, seen = [node.name], set()
    while frontier:
        name = frontier.pop()
        for reader in graph.nodes:
            if name not in reader.inputs or reader.name in seen:
                continue
            seen.add(reader.name)
            if reader.kind == Kind.SHAPE:
                frontier.append(reader.name)
            elif reader.kind != Kind.OUTPUT:
                return True
    return False


def routing_note(graph: Graph, predictions: Dict, display: Callable[[str], str]) -> Optional[str]:
    """One line on the routers' predicted flips under each mode, or None without a router."""
    found = routers(graph)
    if not found:
        return None
    tokens = sum(n.record(DecisionMargins).units for n in found)
    k = found[0].attrs.get("k", 1)
    experts = found[0].input_stats[0].shape[-1]
    rates = []
    for mode, prediction in predictions.items():
        flips = [(prediction.nodes[n.name].flip_fraction, n.record(DecisionMargins).units) for n in found]
        if all(f is None for f, _ in flips):
            continue
        expected = sum((f or 0.0) * units for f, units in flips)
        worst = max(found, key=lambda n: prediction.nodes[n.name].flip_fraction or 0.0)
        rates.append(f"{percent(expected / tokens)} under {mode} ({expected:.2g} of {tokens} routes; most at "
                     f"{display(worst.name)}, {percent(prediction.nodes[worst.name].flip_fraction or 0.0)})")
    if not rates:
        return None
    where = f"{len(found)} router{'s' if len(found) > 1 else ''} (top-{k} of {experts} experts)"
    return (f"mixture of experts: {where} choose each token's experts; a flipped route sends the token through "
            f"another expert, an error far above rounding. Predicted routes that change: {'; '.join(rates)}.")
