"""Several training steps of a model under a precision beside float32 and float64 (``--train --steps N``):
each precision's copy takes the same N steps on the example batch, in lockstep with a float32 and a float64
copy, and after each step its loss and weights are compared with float32's.

- ``loss``: the mode's loss at each step (before that step's update), float32's and float64's beside it;
- ``weight_drift``: after each step, RMS of (the mode's weights' movement from its start - float32's
  movement from its start) over RMS(float32's movement): how differently the weights moved (1: the mode's
  weights did not move where float32's did), the rounding of the starting weights left out;
- ``parts_at``: the first step whose loss differs from float32's by more than PART of it, or is not
  finite (None: it follows float32 for all N steps);
- under a scaled mode, ``scaled_gradient_underflow`` / ``scaled_gradient_saturated``: at each step, the
  share of the converted layers' output-gradient values the recipe flushed / saturated (a delayed-scaling
  recipe's scales come from earlier steps: the first step's 1.0, a stale amax after the loss moves).

A GradScaler's settings drive a scale that halves on a step with inf/NaN gradients (the step skipped) and
doubles after ``growth_interval`` good steps, as GradScaler does.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Optional

import torch

from preclint.measure.training_step import StepRequest, autocast_for, loss_of, prepared
from preclint.measure.scale_statistics import gradient_totals
from preclint.measure.scaled_training import recorded_statistics

PART = 0.01  # a loss 1% away from float32's has parted from it


class _Runner:
    """One copy of the model training under ``mode``, a step at a time."""

    def __init__(self, request: StepRequest, mode: str) -> None:
        self.request, self.mode = request, mode
        self.model, self.inputs, self.targets = prepared(request, mode)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.start = [p.detach().double().clone() for p in self.params]
        self.optimizer = request.step.make_optimizer(self.params)
        scaler = request.step.scaler_for(mode) if mode != "fp32" else None
        self.scaler = scaler
        self.scale = float(scaler["init_scale"]) if scaler else 1.0
        self.good = 0
        self.skipped = 0

    def step(self) -> float:
        torch.manual_seed(self.request.seed)
        with torch.enable_grad(), autocast_for(self.mode, self.request.device):
            loss = loss_of(self.request.step.output(self.model, self.inputs), self.targets, self.request.step.loss_fn, self.request.step.label)
        self.optimizer.zero_grad(set_to_none=True)
        (loss * self.scale if self.scale != 1.0 else loss).backward()
        finite = True
        for p in self.params:
            if p.grad is not None:
                if self.scale != 1.0:
                    p.grad.div_(self.scale)
                finite = finite and bool(torch.isfinite(p.grad).all())
        if self.scaler is None or finite:
            self.optimizer.step()
        if self.scaler is not None:
            self._update_scale(finite)
        return float(loss.detach())

    def _update_scale(self, finite: bool) -> None:
        if not finite:
            self.scale *= self.scaler.get("backoff_factor", 0.5)
            self.good = 0
            self.skipped += 1
            return
        self.good += 1
        if self.good >= self.scaler.get("growth_interval", 2000):
            self.scale *= self.scaler.get("growth_factor", 2.0)
            self.good = 0

    def weights(self) -> List[torch.Tensor]:
        return [p.detach().double().cpu() for p in self.params]


@dataclass
class Trajectory:
    mode: str
    loss: List[float] = field(default_factory=list)
    loss_float32: List[float] = field(default_factory=list)
    loss_float64: List[float] = field(default_factory=list)
    weight_drift: List[Optional[float]] = field(default_factory=list)
    skipped_steps: int = 0
    parts_at: Optional[int] = None  # 1-based
    scaled_gradient_underflow: List[float] = field(default_factory=list)
    scaled_gradient_saturated: List[float] = field(default_factory=list)

    def as_dict(self) -> dict:
        out = {"steps": len(self.loss), "parts_at": self.parts_at, "skipped_steps": self.skipped_steps,
               "loss": self.loss, "loss_float32": self.loss_float32, "loss_float64": self.loss_float64,
               "weight_drift": self.weight_drift}
        if self.scaled_gradient_underflow:
            out.update(scaled_gradient_underflow=self.scaled_gradient_underflow,
                       scaled_gradient_saturated=self.scaled_gradient_saturated)
        return out

    def record_scaled(self, model: torch.nn.Module) -> None:
        """The step's flushed and saturated shares of the converted layers' output gradients."""

        layers = recorded_statistics(model)
        if layers:
            totals = gradient_totals(layers)
            self.scaled_gradient_underflow.append(totals["scaled_gradient_underflow_fraction"])
            self.scaled_gradient_saturated.append(totals["scaled_gradient_saturated_fraction"])


def trajectories(request: StepRequest, modes, steps: int) -> dict:
    """{mode: Trajectory} of ``steps`` steps of each mode beside float32 and float64."""
    float64, float32 = _Runner(request, "float64"), _Runner(request, "fp32")
    runners = {mode: _Runner(request, mode) for mode in modes}
    found = {mode: Trajectory(mode) for mode in modes}
    for index in range(1, steps + 1):
        loss64, loss32 = float64.step(), float32.step()
        moved32 = [w - s for w, s in zip(float32.weights(), float32.start)]
        moved = math.sqrt(sum(float(m.pow(2).sum()) for m in moved32))
        for mode, runner in runners.items():
            loss = runner.step()
            path = found[mode]
            path.loss.append(loss)
            path.loss_float32.append(loss32)
            path.loss_float64.append(loss64)
            apart = math.sqrt(sum(float((w - s - m).pow(2).sum())
                                  for w, s, m in zip(runner.weights(), runner.start, moved32)))
            path.weight_drift.append(apart / moved if moved and math.isfinite(apart) else (None if not math.isfinite(apart) else 0.0))
            path.skipped_steps = runner.skipped
            path.record_scaled(runner.model)
            if path.parts_at is None and (not math.isfinite(loss) or abs(loss - loss32) > PART * abs(loss32)):
                path.parts_at = index
    return found
