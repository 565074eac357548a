"""What a module's parameters and buffers become when they are stored in a reduced format, beyond their
rounding: the elements beyond its range turn inf, those below half its smallest subnormal turn 0.

The consequence is not a rounding error of a few u but a changed function: a batch norm whose
running_var exceeds 65504 divides by sqrt(inf) and outputs its bias, a constant, on those channels
(CREPE's conv2_BN: 0.144 of its output under fp16-full); a weight beyond the range makes the layer's
outputs inf; weights flushed to 0 drop their terms. The reference pass reruns the module once with
only those elements replaced (the rest exact), in float64, and records the relative RMS change of its
output, which the error model adds to the node's error (predict/error_model.py).

Such a change is coherent (a channel's every position moves together), so the gains of independent
roundings (analyses/gains.py), which a pooling averages away, under-rate what reaches the output:
the change e itself is carried instead, along PROBES random output directions v (the mean of
(v . J e)^2 is ||J e||^2), into the output's mean-square change.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import Node
from preclint.reference.analyses import GradientAnalysis, GradientListener
from preclint.core.numerics import FORMATS

if TYPE_CHECKING:
    import torch

# the storage formats whose range a parameter may leave (float32 holds every float32 value)
STORED_FORMATS = ("fp16", "bf16")
PROBES = 8  # directions of the pass that carries the changes to the output (a chi-square of 8 degrees)


@dataclass
class OutOfRange:
    """One format: how many parameter elements leave its range, and what that does to the output."""

    overflow: int  # elements beyond the largest finite value: inf once stored
    flushed: int  # nonzero elements below half the smallest subnormal: 0 once stored
    names: Tuple[str, ...]  # the parameters and buffers holding them
    rel_error: float  # relative RMS change of the module's output (inf where it is not finite)
    nonfinite: float  # the fraction of output elements that become inf or NaN
    # the mean-square change of the model's output it makes, carried there by the gradients (None
    # where the reference pass ran none)
    output_ms: Optional[float] = None


@dataclass
class StoredParameters:
    """Per reduced format (``fp16``, ``bf16``) whose range some of the module's parameters leave."""

    formats: Dict[str, OutOfRange] = field(default_factory=dict)


def _limits(fmt: str) -> Tuple[float, float]:
    return FORMATS[fmt].max_finite, FORMATS[fmt].min_subnormal / 2


def replaced(tensor: torch.Tensor, fmt: str) -> Optional[Tuple[torch.Tensor, int, int]]:
    """``tensor`` in float64 with its elements beyond ``fmt``'s range made inf and those it flushes made
    0 (the rest exact), with the two counts; None where none leaves the range."""
    import torch

    largest, smallest = _limits(fmt)
    magnitude = tensor.detach().abs()
    over = magnitude > largest
    flush = (magnitude > 0) & (magnitude < smallest)
    n_over, n_flush = int(over.sum()), int(flush.sum())
    if not n_over and not n_flush:
        return None
    value = tensor.detach().double().clone()
    value[over] = torch.sign(value[over]) * math.inf
    value[flush] = 0.0
    return value, n_over, n_flush


class StoredParametersAnalysis(GradientAnalysis, GradientListener):
    record = StoredParameters

    def __init__(self) -> None:
        self._clean: Dict[int, bool] = {}  # id(module) -> whether every parameter fits every format
        self._changes: Dict[str, Dict[str, torch.Tensor]] = {}  # node -> format -> the change of its output
        self._sums: Dict[str, Dict[str, float]] = {}

    def watch(self, node: Node, call: Call):
        import torch

        module = call.callee
        if isinstance(module, torch.nn.Module):
            self._observe(node, module, call)
        return ()

    def on_grad(self, name: str, value, grad) -> None:
        changes = self._changes.get(name)
        if not changes or grad is None:
            return
        for fmt, change in changes.items():
            if change.shape == grad.shape:
                sums = self._sums.setdefault(name, {})
                sums[fmt] = sums.get(fmt, 0.0) + float((grad.detach().double() * change).sum()) ** 2

    def finish(self, graph, passes) -> None:
        if not self._changes or not passes.roots:
            return
        run = passes.run(passes.roots, [self], seed=3, probes=PROBES)
        for name, sums in self._sums.items():
            record = graph[name].record(StoredParameters) if graph.get(name) is not None else None
            for fmt, total in sums.items():
                if record is not None and fmt in record.formats and name not in run.unknown:
                    record.formats[fmt].output_ms = total / run.units
        self._changes.clear()

    def _observe(self, node: Node, module, call: Call) -> None:
        import torch

        if self._clean.get(id(module)):
            return
        own = {name: t for name, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))
               if isinstance(t, torch.Tensor) and t.is_floating_point()}
        if not own or list(module.children()):  # leaf modules only: a container's layers are nodes of their own
            self._clean[id(module)] = True
            return
        record = StoredParameters()
        for fmt in STORED_FORMATS:
            found = {name: replaced(t, fmt) for name, t in own.items()}
            found = {name: r for name, r in found.items() if r is not None}
            if found:
                record.formats[fmt], change = _consequence(module, call, own, found)
                if change is not None:
                    self._changes.setdefault(node.name, {})[fmt] = change
        self._clean[id(module)] = not record.formats
        if record.formats:
            node.put(record)


def _consequence(module, call: Call, own, found) -> Tuple[OutOfRange, Optional[torch.Tensor]]:
    """Rerun ``module`` in float64 with the replaced parameters (``found``) against its exact ones."""
    import torch
    from torch.func import functional_call

    def double(value):
        return value.detach().double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    args = tuple(double(a) for a in call.args)
    kwargs = {k: double(v) for k, v in call.kwargs.items()}
    exact = {name: t.detach().double() for name, t in own.items()}
    changed = dict(exact, **{name: r[0] for name, r in found.items()})
    overflow = sum(r[1] for r in found.values())
    flushed = sum(r[2] for r in found.values())
    names = tuple(sorted(found))
    try:
        with torch.no_grad():
            reference = functional_call(module, exact, args, kwargs)
            result = functional_call(module, changed, args, kwargs)
    except Exception:  # noqa: BLE001 - a module that cannot run in float64 or functionally: say what leaves the range
        return OutOfRange(overflow, flushed, names, math.inf if overflow else 0.0, 0.0), None
    if not isinstance(reference, torch.Tensor) or not isinstance(result, torch.Tensor) or result.shape != reference.shape:
        return OutOfRange(overflow, flushed, names, math.inf if overflow else 0.0, 0.0), None
    finite = torch.isfinite(result)
    nonfinite = 1.0 - float(finite.double().mean()) if result.numel() else 0.0
    if nonfinite > 0:
        return OutOfRange(overflow, flushed, names, math.inf, nonfinite), None
    change = result - reference
    scale = float(reference.pow(2).mean().sqrt())
    error = float(change.pow(2).mean().sqrt())
    rel = error / scale if scale > 0 else (0.0 if error == 0 else math.inf)
    return OutOfRange(overflow, flushed, names, rel, 0.0), (change if error > 0 else None)
