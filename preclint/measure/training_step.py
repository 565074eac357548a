"""One training step of a model, run under a precision on a copy: forward, loss, backward, optimizer step.

How each precision trains (the user's own model is never stepped):

- ``float64``: the copy and every floating input and target in float64, no loss scaling: the reference.
- ``fp16``/``bf16``: float32 weights and optimizer, the forward and backward under autocast.
- ``fp16-full``/``bf16-full``: weights, gradients and optimizer state in that dtype, as ``model.half()``.
- ``fp8``/``fp8-rowwise``/``mxfp8``/``nvfp4``: bfloat16 autocast with float32 weights and optimizer, and each linear
  layer the recipe converts running its forward and backward GEMMs on quantised operands, gradients in
  the recipe's gradient format (measure/scaled_training.py).

A GradScaler's settings scale the loss as it would; a step it skips (an inf or NaN gradient at the scale)
is run again from the same start at half the scale, as the scaler settles over the first steps, and the
skips are counted. Hooks record the first module whose output is not finite, in the forward and (its
output's gradient) in the backward.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import torch
from torch.utils._pytree import tree_map

from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.copies import copy_to
from preclint.measure.scaled_training import SCALED_TRAINING_MODES, convert_for_training, recorded_statistics

STEP_DTYPES = {"float64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
               "fp16-full": torch.float16, "bf16-full": torch.bfloat16,
               "fp8": torch.bfloat16, "fp8-rowwise": torch.bfloat16, "mxfp8": torch.bfloat16,
               "nvfp4": torch.bfloat16}
TRAINING_MODES = ("fp32", "fp16", "bf16", "fp16-full", "bf16-full") + SCALED_TRAINING_MODES
AUTOCAST_MODES = ("fp16", "bf16") + SCALED_TRAINING_MODES  # the scaled ones: bfloat16 outside their GEMMs
MAX_SKIPS = 24  # 65536 halved 24 times is below 1/256: a scale that needs more is not a scale problem


def storage_dtype(mode: str) -> torch.dtype:
    """The dtype weights, gradients and optimizer state are stored in under ``mode``."""
    return torch.float32 if mode in AUTOCAST_MODES else STEP_DTYPES[mode]


@dataclass
class ParameterStep:
    before: torch.Tensor  # the weight before the step, in its storage dtype (on the CPU)
    after: torch.Tensor
    grad: Optional[torch.Tensor]  # unscaled, in its storage dtype; None: no gradient reached it
    state: Dict[str, torch.Tensor] = field(default_factory=dict)  # the optimizer's tensors after the step


@dataclass
class StepRun:
    mode: str
    loss: float
    parameters: Dict[str, ParameterStep]
    scale: float = 1.0  # the loss scale of the step that ran
    skipped: int = 0  # steps a GradScaler skipped before this one (each at twice this one's scale)
    first_nonfinite_forward: Optional[str] = None  # module path ("" is the model itself)
    first_nonfinite_backward: Optional[str] = None  # module whose output's gradient was first inf/NaN
    optimizer: Optional[torch.optim.Optimizer] = None
    notes: List[Note] = field(default_factory=list)
    scaled: Dict[str, Dict[str, dict]] = field(default_factory=dict)  # scaled modes: each converted layer's operands


def cast_values(value: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """``value`` with every floating tensor in ``dtype`` on ``device`` (other tensors moved only)."""
    def cast(t):
        if not isinstance(t, torch.Tensor):
            return t
        return t.detach().to(device, dtype if t.is_floating_point() else t.dtype)

    return tree_map(cast, value)


def loss_of(output: Any, targets: Any, loss_fn: Optional[Callable], label: str) -> torch.Tensor:
    """The step's loss: ``loss_fn(output, targets)``, or the loss the model returned (``.loss``,
    ``["loss"]``, or a one-element tensor)."""
    if loss_fn is not None:
        loss = loss_fn(output, targets)
    elif isinstance(output, torch.Tensor) and output.numel() == 1:
        loss = output
    elif isinstance(output, dict) and "loss" in output:
        loss = output["loss"]
    elif getattr(output, "loss", None) is not None:
        loss = output.loss
    else:
        raise UserError(f"{label}: the model returned a {type(output).__name__} and no loss; define "
                        "`loss_fn(output, target)` and `example_targets` in the file (or give the model its labels)")
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or not loss.is_floating_point():
        raise UserError(f"{label}: the loss is {type(loss).__name__}"
                        f"{'' if not isinstance(loss, torch.Tensor) else f' of shape {tuple(loss.shape)}'}; "
                        "a training step needs one floating-point number")
    return loss.reshape(())


class _Watch:
    """Forward hooks on every module: the first whose output is not finite, in the forward and in the
    backward (its output's gradient)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.forward: Optional[str] = None
        self.backward: Optional[str] = None
        self.handles = [m.register_forward_hook(self._hook(path)) for path, m in model.named_modules()]

    def _hook(self, path: str):
        def after_forward(module, args, output):
            for tensor in _tensors(output):
                if self.forward is None and not bool(torch.isfinite(tensor).all()):
                    self.forward = path
                if tensor.requires_grad:
                    tensor.register_hook(self._on_gradient(path))

        return after_forward

    def _on_gradient(self, path: str):
        def on_gradient(grad):
            if self.backward is None and not bool(torch.isfinite(grad).all()):
                self.backward = path
            return grad

        return on_gradient

    def close(self) -> None:
        for handle in self.handles:
            handle.remove()


def _tensors(value: Any) -> List[torch.Tensor]:
    try:
        return [t for t in output_tensors(value) if t.is_floating_point()]
    except Exception:  # noqa: BLE001 - an output no walker knows is simply not watched
        return []


@dataclass
class StepRequest:
    """What to run: the model and its example call, the step's pieces (load/training.py), the device."""

    model: torch.nn.Module
    inputs: Inputs
    step: Any  # preclint.load.training.TrainingStep
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    seed: int = 0


def prepared(request: StepRequest, mode: str):
    """(the copy in ``mode``'s storage dtype in train mode, the inputs, the targets) for one run."""
    dtype = STEP_DTYPES[mode]
    model = copy_to(request.model, request.device, storage_dtype(mode))
    for p in model.parameters():  # copy_to shares what needs no cast; a step writes into its weights
        p.data = p.data.clone()
    model.train()
    if mode in SCALED_TRAINING_MODES:
        convert_for_training(model, mode)
    value_dtype = torch.float32 if mode in AUTOCAST_MODES else dtype
    inputs = request.step.call_inputs(Inputs.of(request.inputs)).map(lambda t: cast_values(t, value_dtype, request.device))
    targets = cast_values(request.step.targets, value_dtype, request.device)
    return model, inputs, targets


def autocast_for(mode: str, device: torch.device):
    if mode not in AUTOCAST_MODES:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=STEP_DTYPES[mode])


def run_step(request: StepRequest, mode: str) -> StepRun:
    """One step under ``mode`` (a key of STEP_DTYPES) from the model's current weights."""
    scaler = request.step.scaler_for(mode)
    scale = request.step.loss_scale(mode)
    skipped = 0
    while True:
        run = _one_step(request, mode, scale)
        finite = run.first_nonfinite_backward is None and all(
            p.grad is None or bool(torch.isfinite(p.grad).all()) for p in run.parameters.values())
        if scaler is None or finite:
            run.skipped = skipped
            return run
        if skipped >= MAX_SKIPS:  # every scale overflows: the step is as GradScaler leaves it, not taken
            run.skipped = skipped
            run.notes.append(Note("training", f"GradScaler skipped {skipped} steps and still found inf/NaN gradients"))
            return run
        skipped += 1
        scale *= scaler.get("backoff_factor", 0.5)


def _one_step(request: StepRequest, mode: str, scale: float) -> StepRun:
    model, inputs, targets = prepared(request, mode)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    before = {name: p.detach().clone().cpu() for name, p in named}
    optimizer = request.step.make_optimizer([p for _, p in named])
    watch = _Watch(model)
    torch.manual_seed(request.seed)
    try:
        with torch.enable_grad(), autocast_for(mode, request.device):
            output = request.step.output(model, inputs)
            loss = loss_of(output, targets, request.step.loss_fn, request.step.label)
        optimizer.zero_grad(set_to_none=True)
        (loss * scale if scale != 1.0 else loss).backward()
    finally:
        watch.close()
    grads_finite = True
    for _, p in named:
        if p.grad is not None:
            if scale != 1.0:
                p.grad.div_(scale)  # as GradScaler.unscale_ does (in the gradient's own dtype)
            grads_finite = grads_finite and bool(torch.isfinite(p.grad).all())
    if request.step.scaler_for(mode) is None or grads_finite:
        optimizer.step()
    parameters = {}
    for name, p in named:
        state = {key: value.detach().clone().cpu() for key, value in optimizer.state.get(p, {}).items()
                 if isinstance(value, torch.Tensor) and value.numel() == p.numel()}
        parameters[name] = ParameterStep(before[name], p.detach().clone().cpu(),
                                         None if p.grad is None else p.grad.detach().clone().cpu(), state)
    loss_value = float(loss.detach())
    scaled = {}
    if mode in SCALED_TRAINING_MODES:
        scaled = recorded_statistics(model)
    return StepRun(mode, loss_value, parameters, scale, first_nonfinite_forward=watch.forward,
                   first_nonfinite_backward=watch.backward, optimizer=optimizer, scaled=scaled)
