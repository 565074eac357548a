"""What the scaled-format rules (FP8, MXFP8, NVFP4) share: the linear layers the reference pass
described (analyses/scaled_operands.py), once per module, under the scaled modes checked."""
from __future__ import annotations

from typing import Callable, Dict, Iterator, Tuple

from preclint.core.numerics import MODES

from preclint.core.ir import Node
from preclint.reference.analyses.scaled_operands import ScaledOperands

GROUP_WORDS = {"tensor": "tensor", "row": "rows", "block": "blocks"}


def scaled_layers(ctx) -> Iterator[Tuple[Node, ScaledOperands]]:
    """Each nn.Linear's first call that carries the statistics, in graph order."""
    seen = set()
    for node in ctx.graph.nodes:
        record = node.record(ScaledOperands)
        if record is None or node.module_path in seen:
            continue
        seen.add(node.module_path)
        yield node, record


def operands_where(ctx, hits: Callable) -> Iterator[Tuple[Node, ScaledOperands, Dict[str, tuple]]]:
    """Each scaled layer with, per mode checked that runs it scaled, the first operand whose statistics
    ``hits`` (operand, statistics, the mode's recipe); layers without one are left out."""
    for node, record in scaled_layers(ctx):
        hit: Dict[str, tuple] = {}
        for mode in ctx.modes:
            recipe = MODES[mode].recipe
            if mode in record.rejected or recipe.keeps(node.module_path):
                continue
            for operand, q in record.modes.get(mode, {}).items():
                if hits(q):
                    hit.setdefault(mode, (operand, q, recipe))
        if hit:
            yield node, record, hit


def dominant_channel(record: ScaledOperands) -> Tuple[int, float]:
    """The input channel with the largest amax, and how many times the 90th percentile of the
    channels' amax it is: large for a few massive channels, small for values spread over every channel."""
    amax = record.channel_absmax
    if not amax:
        return -1, 0.0
    channel = max(range(len(amax)), key=amax.__getitem__)
    ranked = sorted(amax)
    p90 = ranked[min(len(ranked) - 1, int(0.9 * (len(ranked) - 1)))]
    return channel, (amax[channel] / p90 if p90 > 0 else float("inf"))
