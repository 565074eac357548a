"""What each precision does to one training step, predicted from the float64 step's statistics
(reference/training_step.py) before any low-precision run.

Per parameter:

- ``underflow_fraction``: of the gradient's nonzero elements, those the precision stores as 0 at the
  step's loss scale (the weight gradient's own flush, and the flushes of the low-dtype gradients it is
  computed from);
- ``grad_rel_error``: RMS error of the gradient over its RMS: the flushes' error, in quadrature with the
  rounding of each low-precision backward GEMM on its way from the loss (C_INPUT * u per GEMM, the error
  model's per-format figure, NUMERICS.md), the forward's predicted output error (predict/error_model.py) and
  the error of the ReLU-like masks the forward's rounding flips (reference/kinks.py);
- ``lost_update_fraction``: of the weights the float64 step moves, those the precision leaves unchanged: the
  optimizer's update from the flushed gradients is 0, or under half a spacing of the weight in its storage
  dtype (float32 under autocast, the low dtype under ``-full``);
- ``nonfinite_updates``: weights the step makes inf or NaN: a gradient that overflows without a scaler, or
  an Adam-family state whose second moment stores 0 while its eps rounds to 0 in the state dtype;
- the optimizer state's hazards: eps that rounds to 0 or to a subnormal, state elements that flush or overflow.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

from preclint.core.notes import Note
from preclint.core.numerics import C_INPUT, MODES
from preclint.reference.training_step import ModeStatistics, TrainingReference, reference_step
from preclint.measure.training_step import STEP_DTYPES, storage_dtype, TRAINING_MODES, StepRequest
from preclint.training.statistics import (flush_threshold, flushes, lost_updates, overflows, relative_error,
                                          scale_window)
from preclint.measure.scale_statistics import gradient_totals
from preclint.measure.scaled_training import recipes

SECOND_MOMENTS = ("exp_avg_sq", "square_avg", "sum")  # Adam/AdamW, RMSprop, Adagrad: the divisor's state
WINDOW_UNDERFLOW = 0.01  # the scale window's low end keeps all but this fraction of low-dtype gradients
HAZARD_SHARE = 0.01  # a first moment or momentum that flushes in more than this share of its elements


@dataclass
class ParameterFigures:
    """One parameter's figures under one precision (predicted or measured)."""

    parameter: str
    module: str
    numel: int
    grad_rel_error: Optional[float]
    underflow_fraction: float
    lost_update_fraction: float
    nonfinite_updates: int
    hazards: List[str] = field(default_factory=list)

    def as_dict(self) -> Dict[str, object]:
        return {"parameter": self.parameter, "module": self.module, "numel": self.numel,
                "grad_rel_error": self.grad_rel_error, "underflow_fraction": self.underflow_fraction,
                "lost_update_fraction": self.lost_update_fraction, "nonfinite_updates": self.nonfinite_updates,
                **({"hazards": list(self.hazards)} if self.hazards else {})}


@dataclass
class TrainingFigures:
    """One precision's step: totals over every parameter (element-weighted) and the per-parameter rows."""

    mode: str
    grad_rel_error: Optional[float]
    underflow_fraction: float
    lost_update_fraction: float
    nonfinite_updates: int
    loss_scale: float
    parameters: List[ParameterFigures]
    skipped_steps: int = 0
    # of the weights the float64 step moves, those float32 storage alone loses (the baseline of a float32 step)
    float32_lost_update_fraction: Optional[float] = None
    scale_window: Optional[tuple] = None  # (low, high) loss scales; predicted only
    first_nonfinite_forward: Optional[str] = None
    first_nonfinite_backward: Optional[str] = None
    hazards: List[str] = field(default_factory=list)  # the optimizer's, said once
    # scaled modes: per converted linear layer, its operands' scale statistics (measure/scale_statistics.py)
    scaled: Dict[str, Dict[str, dict]] = field(default_factory=dict)

    @property
    def scaled_gradient_underflow(self) -> float:
        """The largest fraction of a converted layer's output gradient that the recipe flushes (0: none)."""
        return max((stats["grad_output"]["underflow_fraction"] for stats in self.scaled.values()
                    if "grad_output" in stats), default=0.0)

    def as_dict(self) -> Dict[str, object]:
        out = {"grad_rel_error": self.grad_rel_error, "underflow_fraction": self.underflow_fraction,
               "lost_update_fraction": self.lost_update_fraction, "nonfinite_updates": self.nonfinite_updates,
               "loss_scale": self.loss_scale, "skipped_steps": self.skipped_steps,
               "float32_lost_update_fraction": self.float32_lost_update_fraction,
               "first_nonfinite_forward": self.first_nonfinite_forward,
               "first_nonfinite_backward": self.first_nonfinite_backward,
               "hazards": list(self.hazards), "parameters": [p.as_dict() for p in self.parameters],
               "layers": self.layers()}
        if self.scale_window is not None:
            out["scale_window"] = list(self.scale_window)
        if self.scaled:
            out.update(gradient_totals(self.scaled))
            out["scaled"] = self.scaled
        return out


    def layers(self) -> List[Dict[str, object]]:
        """Per module (in the order its parameters come), its parameters' figures weighted by their sizes
        (the gradient error: the largest of its parameters')."""
        grouped: Dict[str, List[ParameterFigures]] = {}
        for row in self.parameters:
            grouped.setdefault(row.module, []).append(row)
        out = []
        for module, rows in grouped.items():
            size = sum(r.numel for r in rows) or 1
            errors = [r.grad_rel_error for r in rows]
            out.append({"module": module, "numel": size,
                        "grad_rel_error": None if any(e is None for e in errors) else max(errors),
                        "underflow_fraction": sum(r.underflow_fraction * r.numel for r in rows) / size,
                        "lost_update_fraction": sum(r.lost_update_fraction * r.numel for r in rows) / size,
                        "nonfinite_updates": sum(r.nonfinite_updates for r in rows)})
        return out


def totals(mode: str, rows: List[ParameterFigures], grads: Dict[str, torch.Tensor], updates: Dict[str, torch.Tensor],
           **extra) -> TrainingFigures:
    """The element-weighted totals of ``rows``: underflow over the gradients' nonzero elements, lost updates
    over the updates' nonzero elements, the gradient error weighted by each gradient's squared norm."""
    nonzero_g = {r.parameter: int(torch.count_nonzero(grads[r.parameter])) if r.parameter in grads else 0 for r in rows}
    nonzero_u = {r.parameter: int(torch.count_nonzero(updates[r.parameter])) if r.parameter in updates else 0 for r in rows}
    norms = {r.parameter: float(grads[r.parameter].double().pow(2).sum()) if r.parameter in grads else 0.0 for r in rows}
    under = sum(r.underflow_fraction * nonzero_g[r.parameter] for r in rows) / max(1, sum(nonzero_g.values()))
    lost = sum(r.lost_update_fraction * nonzero_u[r.parameter] for r in rows) / max(1, sum(nonzero_u.values()))
    errors = [(r.grad_rel_error, norms[r.parameter]) for r in rows if norms[r.parameter] > 0]
    if any(e is None for e, _ in errors):
        error = None
    elif any(math.isinf(e) for e, _ in errors):
        error = math.inf
    else:
        total = sum(n for _, n in errors)
        error = math.sqrt(sum(e * e * n for e, n in errors) / total) if total else 0.0
    return TrainingFigures(mode, error, under, lost, sum(r.nonfinite_updates for r in rows), parameters=rows, **extra)


def predict_training(reference: TrainingReference, forward_errors: Optional[Dict[str, Optional[float]]] = None
                     ) -> Dict[str, TrainingFigures]:
    """Each precision's predicted figures (``forward_errors``: the predicted relative output error of each
    mode's forward, where the check made one)."""
    return {mode: _predict_mode(reference, stats, (forward_errors or {}).get(mode))
            for mode, stats in reference.modes.items()}


def _predict_mode(reference: TrainingReference, stats: ModeStatistics, forward_error: Optional[float]) -> TrainingFigures:
    mode = stats.mode
    dtype, storage = STEP_DTYPES[mode], storage_dtype(mode)
    u = _backward_unit_roundoff(mode)
    owners = {reference.module_of[name] for name in stats.low_grad_params}
    order = {path: i for i, path in enumerate(reference.module_order)}
    overflowing = _first_overflow(reference, stats, dtype)
    hazards = optimizer_hazards(reference.optimizer, storage)
    rows = []
    lost32 = [0, 0]
    for name, p in reference.step.parameters.items():
        g64 = p.grad if p.grad is not None else torch.zeros_like(p.before)
        flushed_grad = stats.flushed_grads.get(name, g64)
        nonzero = int(torch.count_nonzero(g64))
        under = int(((flushed_grad == 0) & (g64 != 0)).sum()) / nonzero if nonzero else 0.0
        module = reference.module_of[name]
        after = sum(1 for path in owners if order.get(path, -1) > order.get(module, -1))
        rounding = C_INPUT * u * math.sqrt(1 + after) if name in stats.low_grad_params or after else 0.0
        if storage != torch.float32:
            rounding = math.hypot(rounding, u / math.sqrt(3))  # the gradient stored in the low dtype
        masks = stats.mask_errors.get(name, 0.0)
        error = math.sqrt(relative_error(flushed_grad, g64) ** 2 + rounding ** 2 + (forward_error or 0.0) ** 2
                          + masks ** 2) if nonzero else 0.0
        update64 = reference.update(name)
        update = stats.flushed_updates.get(name, update64)
        moved = update64 != 0
        lost_mask = moved & ((update == 0) | lost_updates(p.before, update, storage))
        lost = int(lost_mask.sum()) / int(moved.sum()) if int(moved.sum()) else 0.0
        lost32[0] += int(lost_updates(p.before, update64, torch.float32).sum())
        lost32[1] += int(moved.sum())
        nonfinite, row_hazards = _nonfinite(reference, stats, name, storage, overflowing=overflowing, order=order)
        rows.append(ParameterFigures(name, module, p.before.numel(), error if nonfinite == 0 else math.inf,
                                     under, lost, nonfinite, row_hazards))
    grads = {name: p.grad for name, p in reference.step.parameters.items() if p.grad is not None}
    updates = {name: reference.update(name) for name in reference.step.parameters}
    return totals(mode, rows, grads, updates, loss_scale=stats.scale, skipped_steps=stats.skipped,
                  float32_lost_update_fraction=lost32[0] / lost32[1] if lost32[1] else 0.0,
                  scale_window=window(stats, dtype), first_nonfinite_forward=reference.step.first_nonfinite_forward,
                  first_nonfinite_backward=overflowing if overflowing is not None else reference.step.first_nonfinite_backward,
                  hazards=hazards, scaled=stats.scaled)


def _backward_unit_roundoff(mode: str) -> float:
    """The unit roundoff a backward GEMM's result carries per operand rounding: the dtype's; a scaled mode
    rounds both operands, one to the gradient's element format and one to the forward's."""
    recipe = MODES[mode].recipe
    if recipe is None:
        return MODES[mode].dot_format.unit_roundoff

    forward, gradient = recipes(mode)
    return math.hypot(forward.element.unit_roundoff, gradient.element.unit_roundoff)


def _first_overflow(reference: TrainingReference, stats: ModeStatistics, dtype: torch.dtype) -> Optional[str]:
    """The module whose output's gradient is the first (in backward order) to overflow at the step's scale."""
    limit = float(torch.finfo(dtype).max)
    # a container hands on its last child's output: the child is the one to name
    leaves = [path for path in stats.low_outputs
              if not any(other != path and (path == "" or other.startswith(path + ".")) for other in stats.low_outputs)]
    for path in reversed(leaves or stats.low_outputs):
        if stats.output_grad_max.get(path, 0.0) * stats.scale >= limit:
            return path
    return None


def _nonfinite(reference, stats, name, storage, *, overflowing, order):
    """(weights the step predicts inf/NaN, the parameter's state hazards)."""
    p = reference.step.parameters[name]
    dtype = STEP_DTYPES[stats.mode]
    count = 0
    if not bool(torch.isfinite(p.after).all()):
        count = int((~torch.isfinite(p.after)).sum())
    elif overflowing is not None and order.get(reference.module_of[name], -1) <= order.get(overflowing, -1):
        count = p.before.numel()  # an inf gradient upstream of the overflow reaches this weight's gradient
    elif name in stats.low_grad_params and bool(overflows(stats.flushed_grads[name], dtype, stats.scale).any()):
        count = int(overflows(stats.flushed_grads[name], dtype, stats.scale).sum())
    hazards = []
    state = stats.flushed_state.get(name, {})
    eps = reference.optimizer.get("eps")
    eps_flushes = isinstance(eps, float) and eps <= flush_threshold(storage)
    for key, value in state.items():
        flushed = int(flushes(value, storage).sum())
        over = int(overflows(value, storage).sum())
        # a second moment that stores 0 divides by eps alone: harmless unless eps is 0 too; another state
        # (a momentum, a first moment) that flushes loses that much of its updates
        if flushed and (eps_flushes if key in SECOND_MOMENTS else flushed > HAZARD_SHARE * value.numel()):
            hazards.append(f"{key}: {flushed} of {value.numel()} elements store 0 in {_dtype(storage)}")
        if over:
            hazards.append(f"{key}: {over} of {value.numel()} elements overflow {_dtype(storage)}")
            count = max(count, over)
        if key in SECOND_MOMENTS and eps_flushes and count == 0:
            zero = (value == 0) | flushes(value, storage)
            count = int(zero.sum())  # 0 / (sqrt(0) + 0): NaN, or m / 0: inf
    return count, hazards


def optimizer_hazards(settings: Dict[str, object], storage: torch.dtype) -> List[str]:
    eps = settings.get("eps")
    if not isinstance(eps, float) or eps <= 0 or storage == torch.float64:
        return []
    if eps <= flush_threshold(storage):
        return [f"{settings.get('class', 'the optimizer')}'s eps={eps:g} rounds to 0 in {_dtype(storage)}: a second "
                "moment that stores 0 divides by 0"]
    if eps < float(torch.finfo(storage).smallest_normal):
        return [f"{settings.get('class', 'the optimizer')}'s eps={eps:g} is subnormal in {_dtype(storage)} "
                f"(stored as {float(torch.tensor(eps, dtype=storage)):.3g})"]
    return []


def window(stats: ModeStatistics, dtype: torch.dtype) -> Optional[tuple]:
    """The loss scales between which at most WINDOW_UNDERFLOW of the low-dtype gradients flush and none
    overflows (None: no low-dtype gradient)."""
    spread = stats.gradient_magnitudes
    if spread.nonzero == 0:
        return None
    needed = spread.nonzero * WINDOW_UNDERFLOW
    seen, kept = 0, spread.smallest
    for i, count in enumerate(spread.counts):
        seen += count
        if seen > needed:
            kept = 2.0 ** (spread.low + i - 1)
            break
    return scale_window(spread.largest, kept, dtype)


def _dtype(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def training_modes(modes, model: torch.nn.Module) -> tuple:
    """The precisions a training step is checked under: those of ``modes`` a step has (TRAINING_MODES); a
    model whose weights are already float16 or bfloat16 trains as written, in that dtype (``-full``)."""

    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    for dtype, mode in ((torch.float16, "fp16-full"), (torch.bfloat16, "bf16-full")):
        if dtypes == {dtype}:
            return (mode,)
    return tuple(mode for mode in modes if mode in TRAINING_MODES)


def predict_step(loaded, modes, forward_errors: Optional[Dict[str, Optional[float]]] = None, seed: int = 0):
    """(the reference step, each training precision's predicted figures, notes) of ``loaded`` (a LoadedModel
    with ``training``), on the CPU."""

    chosen = training_modes(modes, loaded.module)
    notes: List[Note] = []
    if chosen and set(chosen) - set(modes):
        notes.append(Note("training", f"the model's weights are {_dtype(next(loaded.module.parameters()).dtype)}: its "
                                      f"training step is checked as written ({', '.join(chosen)})"))
    untrained = [mode for mode in modes if mode in MODES and MODES[mode].recipe is not None and mode not in TRAINING_MODES]
    if untrained:
        notes.append(Note("training", f"--train: no training step under {', '.join(untrained)}"))
    if not chosen:
        notes.append(Note("training", "--train: none of the checked precisions is one a training step runs in (fp16, "
                                      "bf16, fp16-full, bf16-full, fp8, fp8-rowwise, mxfp8, nvfp4); no training figures"))
        return None, {}, notes
    request = StepRequest(loaded.module, loaded.inputs, loaded.training, seed=seed)
    reference = reference_step(request, chosen)
    notes += list(getattr(loaded.training, "notes", []))
    return reference, predict_training(reference, forward_errors), notes + list(reference.notes)
