"""Sampled inputs: how much an op's result moves with an input its backward gives no gradient, from a
small relative perturbation of that input (a finite difference).

RoIAlign reads the boxes it pools at as positions, and its backward returns no gradient for them:
the gains carry no error of the boxes into the pooled features, though a box that moved by a tenth
of a pixel samples other values. A detector's proposals carry the error of the box regression that
made them (and of the candidates that won in their place), and that error reached its class scores,
its masks and its keypoints only through such sampling: predicted from the arithmetic alone,
Keypoint R-CNN's scores were 12-94x under the error measured over the kept detections, Mask R-CNN's
masks 24x. So each such input gets the factor by which the op multiplies a relative error of it, and
the error model adds that input's error, times the factor, to the op's result (which the gains carry on).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from preclint.capture.observer import Call
from preclint.core.ir import Kind, Node
from preclint.reference.analyses import ForwardAnalysis

# Ops that read positions (boxes, sampling grids) among their operands. An input whose gradient the
# op does give (grid_sample's grid) is weighed by the gains; the error model uses the factor only
# where the gains have none.
SAMPLING_KINDS = frozenset({Kind.RESAMPLE, Kind.POOL})
# The relative perturbation: large enough to be seen above a float32 reference's rounding, small
# enough to stay within a bilinear cell (a coordinate of 100 pixels moves by 0.1).
STEP = 1e-3


@dataclass
class SampledInputs:
    """Input node -> how many times the op multiplies a relative RMS error of that input (an input
    after the first, which the op reads as positions)."""

    factors: Dict[str, float] = field(default_factory=dict)


def _float_tensors(values) -> list:
    import torch
    from torch.utils._pytree import tree_flatten

    return [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()]


class SampledInputsAnalysis(ForwardAnalysis):
    record = SampledInputs

    def observe(self, node: Node, call: Call) -> None:
        import torch

        if node.kind not in SAMPLING_KINDS or not callable(call.callee) or not call.outputs:
            return
        out = call.outputs[0]
        operands = _float_tensors((call.args, call.kwargs))
        # operands in the order the node names its inputs (each a value some op made)
        if not isinstance(out, torch.Tensor) or not out.is_floating_point() or len(operands) != len(node.inputs) \
                or len(operands) < 2:
            return
        reference = out.detach().double()
        scale = float(reference.pow(2).mean().sqrt()) if reference.numel() else 0.0
        if scale <= 0:
            return
        record = SampledInputs()
        generator = torch.Generator().manual_seed(0)
        for position in range(1, len(operands)):
            x = operands[position].detach()
            size = float(x.double().pow(2).mean().sqrt()) if x.numel() else 0.0
            if size <= 0:
                continue
            noise = torch.randn(x.shape, generator=generator, dtype=torch.float64).to(x.device)
            moved = (x.double() * (1.0 + STEP * noise)).to(x.dtype)
            step = float((moved.double() - x.double()).pow(2).mean().sqrt()) / size
            if step <= 0:
                continue
            args, kwargs = _replaced((call.args, call.kwargs), operands[position], moved)
            try:
                with torch.no_grad():
                    again = call.callee(*args, **kwargs)
            except Exception:  # (an op that refuses the moved operand: no factor, as without the analysis)
                continue
            again = again if isinstance(again, torch.Tensor) else _float_tensors(again)[0] if _float_tensors(again) else None
            if again is None or again.shape != reference.shape:
                continue
            change = float((again.double() - reference).pow(2).mean().sqrt()) / scale
            if change > 0:
                record.factors[node.inputs[position]] = change / step
        if record.factors:
            node.put(record)


def _replaced(values, old, new):
    """``values`` (args, kwargs) with the tensor ``old`` replaced by ``new``."""
    from torch.utils._pytree import tree_map

    return tree_map(lambda v: new if v is old else v, values)
