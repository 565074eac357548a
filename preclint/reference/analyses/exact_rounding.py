"""The exact error of storing a probability (a softmax or sigmoid result) in float16 and bfloat16.

A trained classifier saturates its probabilities: a face probability of 1 - 1e-7 rounds to 1.0 in
float16 by 1e-7, far below the C_OUTPUT u (2e-4) that values spread over the format's spacing get. A
cast model's float16 softmax of a trained CNN was predicted 2.0e-4 against 3.8e-7 measured (the CPU
emulation). The rounding is one cast of the reference values, so it is measured, not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from preclint.capture.observer import Call
from preclint.core.ir import Kind, Node
from preclint.reference.analyses import ForwardAnalysis


@dataclass
class ExactRounding:
    """Format -> the relative RMS error (to the value's RMS) of storing the node's result in it."""

    relative: Dict[str, float] = field(default_factory=dict)


def is_probability(node: Node) -> bool:
    return (node.kind == Kind.SOFTMAX and node.fn == "softmax") or node.fn == "sigmoid"


class ExactRoundingAnalysis(ForwardAnalysis):
    record = ExactRounding

    def observe(self, node: Node, call: Call) -> None:
        import torch

        if not is_probability(node) or not call.outputs or not isinstance(call.outputs[0], torch.Tensor):
            return
        value = call.outputs[0].detach()
        if not value.is_floating_point() or not value.numel():
            return
        value = value.float()
        rms = float(value.pow(2).mean().sqrt())
        if rms <= 0:
            return
        record = ExactRounding()
        for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
            error = value.to(dtype).float() - value
            error = torch.where(torch.isfinite(error), error, torch.zeros_like(error))
            record.relative[fmt] = float(error.pow(2).mean().sqrt()) / rms
        node.put(record)
