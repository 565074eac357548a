"""The exact error of storing a probability (a softmax or sigmoid result) in float16 and bfloat16,
and of storing an elementwise result or a cast whose values lie on the format's grid.

A trained classifier saturates its probabilities: a face probability of 1 - 1e-7 rounds to 1.0 in
float16 by 1e-7, far below the C_OUTPUT u (2e-4) that values spread over the format's spacing get. A
cast model's float16 softmax of a trained CNN was predicted 2.0e-4 against 3.8e-7 measured (the CPU
emulation). The rounding is one cast of the reference values, so it is measured, not modelled.

Coordinates are often whole pixels: a detector's anchors are integers, their centres half-integers,
and the box a regression moves a twentieth of a pixel off one rounds back by that twentieth, not by
half the spacing (bfloat16's is 0.5 near 100). Decoded in bfloat16, a random-init Faster R-CNN's boxes
were predicted 6.6x over the measured error from C_OUTPUT u. Such values' measured rounding is used
where it lies far below C_OUTPUT u (``grid_rounding``); values spread over the spacing keep the model.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from preclint.capture.observer import Call
from preclint.core.ir import Kind, Node
from preclint.core.numerics import C_OUTPUT
from preclint.reference.analyses import ForwardAnalysis


@dataclass
class ExactRounding:
    """Format -> the relative RMS error (to the value's RMS) of storing the node's result in it."""

    relative: Dict[str, float] = field(default_factory=dict)


# Results whose values may lie on a format's grid (arithmetic on whole pixels, casts of them).
GRID_KINDS = frozenset({Kind.ELEMENTWISE, Kind.CAST})
# A measured rounding below this fraction of C_OUTPUT u is values on the grid (whole or half pixels);
# above it the values spread over the spacing, where C_OUTPUT u is the model's figure.
ON_GRID = 0.25
# Elements rounded to measure it: a strided sample of a large result (two casts of each element).
MAX_SAMPLED = 1 << 16


def is_probability(node: Node) -> bool:
    return (node.kind == Kind.SOFTMAX and node.fn == "softmax") or node.fn == "sigmoid"


def measured_rounding(node: Node, fmt: str, unit_roundoff: float):
    """The measured relative rounding of the node's result in ``fmt`` where it replaces C_OUTPUT u: a
    probability's always, another value's where it lies on the grid; else None."""
    exact = node.record(ExactRounding)
    rounding = exact.relative.get(fmt) if exact is not None else None
    if rounding is None or is_probability(node) or rounding < ON_GRID * C_OUTPUT * unit_roundoff:
        return rounding
    return None


class ExactRoundingAnalysis(ForwardAnalysis):
    record = ExactRounding

    def observe(self, node: Node, call: Call) -> None:
        import torch

        if not (is_probability(node) or node.kind in GRID_KINDS) or not call.outputs \
                or not isinstance(call.outputs[0], torch.Tensor):
            return
        value = call.outputs[0].detach()
        if not value.is_floating_point() or not value.numel():
            return
        value = value.flatten()
        if not is_probability(node) and value.numel() > MAX_SAMPLED:
            value = value[:: -(-value.numel() // MAX_SAMPLED)]
        value = value.float().double()  # (float32 values; their squares near 1e21 overflow float32)
        rms = float(value.pow(2).mean().sqrt())
        if rms <= 0:
            return
        record = ExactRounding()
        for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            error = value.to(dtype).double() - value
            error = torch.where(torch.isfinite(error), error, torch.zeros_like(error))
            record.relative[fmt] = float(error.pow(2).mean().sqrt()) / rms
        node.put(record)
