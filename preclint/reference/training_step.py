"""The reference training step: one step in float64 on a copy of the model (measure/training_step.py),
and the statistics the error model predicts each precision's step from (predict/training.py).

Beside the float64 step's gradients, updates and optimizer state, it records per precision:

- which module outputs hold their value, and so their gradient, in the low dtype (an autocast forward of a
  float32 copy tells; under ``-full`` every one), and each one's largest gradient magnitude;
- the loss scale the step runs at: the scaler's initial scale, halved while a low-dtype gradient would
  overflow (as GradScaler backs off over the first steps); 1 without a scaler;
- the gradients a backward gives when each of those low-dtype gradients flushes where the format stores
  0 (a float64 backward from the same forward, the flush applied at each such module output and at each
  low-precision weight gradient): only underflow is modelled, the rounding is the error model's;
- the optimizer's float64 step taken on those flushed gradients: the update each weight would get;
- under a scaled mode (fp8, fp8-rowwise, mxfp8, nvfp4), also the flushes of each converted linear layer's
  quantised output gradient and the scale statistics of its operands (reference/scaled_training.py);
- each parameter's gradient error from the ReLU-like kinks the mode's forward rounding crosses
  (reference/kinks.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Set

import torch

from preclint.measure.training_step import (AUTOCAST_MODES, SCALED_TRAINING_MODES, STEP_DTYPES, StepRequest, StepRun,
                                            autocast_for, loss_of, prepared, run_step)
from preclint.core.notes import Note
from preclint.load.modelio import output_tensors
from preclint.training.statistics import Magnitudes, flush_threshold, flushes, magnitudes, overflows
from preclint.core.numerics import MODES
from preclint.reference.kinks import mask_errors
from preclint.reference.scaled_training import ScaledFlushes

# modules whose weight gradient is a low-precision GEMM's output under autocast (autocast's lower list)
LOWERED_MODULES = (torch.nn.Linear, torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.ConvTranspose1d,
                   torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d, torch.nn.Bilinear)


@dataclass
class ModeStatistics:
    """One precision's view of the float64 step."""

    mode: str
    scale: float  # the loss scale the step settles on
    skipped: int  # steps a GradScaler skips to reach it
    low_outputs: List[str]  # module paths whose output (and gradient) is in the low dtype, forward order
    low_grad_params: Set[str]  # parameters whose gradient is computed in the low dtype
    output_grad_max: Dict[str, float]  # module path -> largest |gradient| of its output (unscaled)
    gradient_magnitudes: Magnitudes  # of every low-dtype gradient (module outputs and weights), unscaled
    flushed_grads: Dict[str, torch.Tensor]  # parameter -> its float64 gradient with the flushes applied
    flushed_updates: Dict[str, torch.Tensor]  # parameter -> the float64 optimizer's update on those gradients
    flushed_state: Dict[str, Dict[str, torch.Tensor]]  # parameter -> that optimizer's state tensors after it
    # scaled modes: each converted linear layer's operand statistics (measure/scale_statistics.py)
    scaled: Dict[str, Dict[str, dict]] = field(default_factory=dict)
    # parameter -> its gradient's error from kinks the forward's rounding crosses, relative to its norm
    mask_errors: Dict[str, float] = field(default_factory=dict)


@dataclass
class TrainingReference:
    step: StepRun  # the float64 step (its parameters in float64)
    module_of: Dict[str, str]  # parameter -> the module path that owns it
    module_order: List[str]  # module paths in the order their forward finished
    optimizer: Dict[str, object]  # the first group's hyperparameters and the optimizer's class name
    modes: Dict[str, ModeStatistics] = field(default_factory=dict)
    notes: List[Note] = field(default_factory=list)

    def update(self, name: str) -> torch.Tensor:
        p = self.step.parameters[name]
        return p.after - p.before


def reference_step(request: StepRequest, modes) -> TrainingReference:
    """The float64 step of ``request`` and each of ``modes``' statistics (TRAINING_MODES among them)."""
    step = run_step(request, "float64")
    model = request.model
    module_of = {name: name.rpartition(".")[0] for name, _ in model.named_parameters()}
    group = step.optimizer.param_groups[0] if step.optimizer is not None else {}
    optimizer = {k: v for k, v in group.items() if k != "params" and isinstance(v, (int, float, tuple, bool))}
    optimizer["class"] = type(step.optimizer).__name__
    reference = TrainingReference(step, module_of, [], optimizer)
    backward = _Backward(request)
    reference.module_order = backward.order
    for mode in modes:
        reference.modes[mode] = _mode_statistics(request, backward, reference, mode)
    _add_mask_errors(request, reference)
    return reference


def _add_mask_errors(request: StepRequest, reference: TrainingReference) -> None:
    units = {mode: MODES[mode].dot_format.unit_roundoff for mode in reference.modes if mode in MODES}
    grads = {name: p.grad for name, p in reference.step.parameters.items() if p.grad is not None}
    try:
        found = mask_errors(request, units, grads)
    except Exception as error:  # noqa: BLE001 - a forward the recording cannot follow: the floor alone
        reference.notes.append(Note("training", "--train: the gradient error of ReLU-like masks was not predicted "
                                                f"({type(error).__name__})"))
        return
    for mode, errors in found.items():
        reference.modes[mode].mask_errors = errors


class _Backward:
    """One float64 forward of a copy, kept, whose backward is run once plainly (each module output's
    gradient recorded) and once per precision with that precision's flushes."""

    def __init__(self, request: StepRequest) -> None:
        self.request = request
        model, inputs, targets = prepared(request, "float64")
        self.params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        self.outputs: Dict[str, List[torch.Tensor]] = {}
        self.inputs: Dict[str, torch.Tensor] = {}  # a linear layer's input (its first call's)
        self.order: List[str] = []
        handles = [m.register_forward_hook(self._keep(path)) for path, m in model.named_modules()]
        torch.manual_seed(request.seed)
        try:
            with torch.enable_grad():
                self.loss = loss_of(request.step.output(model, inputs), targets, request.step.loss_fn, request.step.label)
        finally:
            for handle in handles:
                handle.remove()
        tensors = [t for path in self.order for t in self.outputs[path]]
        grads = torch.autograd.grad(self.loss, tensors, retain_graph=True, allow_unused=True) if tensors else []
        self.output_grads: Dict[str, List[torch.Tensor]] = {}
        it = iter(grads)
        for path in self.order:
            self.output_grads[path] = [g for g in (next(it) for _ in self.outputs[path]) if g is not None]
        self.model = model

    def _keep(self, path: str):
        def keep(module, args, output):
            found = [t for t in _float_outputs(output) if t.requires_grad]
            if found and path not in self.outputs:  # a module called twice: its first call's output
                self.outputs[path] = found
                self.order.append(path)
                if isinstance(module, torch.nn.Linear) and args and isinstance(args[0], torch.Tensor):
                    self.inputs[path] = args[0].detach()

        return keep

    def flushed(self, low: Set[str], dtype: torch.dtype, scale: float,
                transforms: Optional[Dict[str, Callable]] = None) -> Dict[str, torch.Tensor]:
        """The parameters' gradients with each low-dtype module output's gradient flushed at ``scale``, and
        ``transforms`` (module path -> a function of its output's gradient) applied after that."""
        handles = []
        threshold = flush_threshold(dtype) / scale
        for path in low:
            for t in self.outputs.get(path, []):
                handles.append(t.register_hook(lambda g: torch.where(g.abs() <= threshold, torch.zeros_like(g), g)))
        for path, transform in (transforms or {}).items():
            for t in self.outputs.get(path, [])[:1]:
                handles.append(t.register_hook(transform))
        try:
            grads = torch.autograd.grad(self.loss, [p for _, p in self.params], retain_graph=True, allow_unused=True)
        finally:
            for handle in handles:
                handle.remove()
        return {name: (torch.zeros_like(p) if g is None else g.detach()) for (name, p), g in zip(self.params, grads)}


def _float_outputs(output) -> List[torch.Tensor]:
    try:
        return [t for t in output_tensors(output) if t.is_floating_point()]
    except Exception:  # noqa: BLE001 - an output no walker knows is not followed
        return []


def low_dtype_outputs(request: StepRequest, mode: str) -> List[str]:
    """The modules whose output is in ``mode``'s low dtype: every one under ``-full``; under autocast, those
    a float32 forward under autocast leaves in it."""
    if mode not in AUTOCAST_MODES:
        return [path for path, _ in request.model.named_modules()]
    model, inputs, _ = prepared(request, mode)
    low: List[str] = []
    dtype = STEP_DTYPES[mode]

    def hook(path):
        def record(module, args, output):
            if any(t.dtype == dtype for t in _float_outputs(output)) and path not in low:
                low.append(path)
        return record

    handles = [m.register_forward_hook(hook(path)) for path, m in model.named_modules()]
    torch.manual_seed(request.seed)
    try:
        with torch.no_grad(), autocast_for(mode, request.device):
            request.step.output(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return low


def _mode_statistics(request: StepRequest, backward: _Backward, reference: TrainingReference,
                     mode: str) -> ModeStatistics:
    dtype = STEP_DTYPES[mode]
    low = low_dtype_outputs(request, mode)
    modules = dict(request.model.named_modules())
    if mode in AUTOCAST_MODES:
        low_params = {name for name in reference.module_of
                      if reference.module_of[name] in low and isinstance(modules.get(reference.module_of[name]), LOWERED_MODULES)}
    else:
        low_params = set(reference.module_of)
    grads64 = {name: p.grad for name, p in reference.step.parameters.items() if p.grad is not None}
    low_values = [g for path in low for g in backward.output_grads.get(path, [])] + \
                 [grads64[name] for name in low_params if name in grads64]
    joined = torch.cat([v.reshape(-1) for v in low_values]) if low_values else torch.zeros(0, dtype=torch.float64)
    spread = magnitudes(joined)
    scale, skipped = settled_scale(spread.largest, request.step.scaler_for(mode), dtype)
    scaled = None
    if mode in SCALED_TRAINING_MODES:
        scaled = ScaledFlushes(request, backward, mode)
    flushed = backward.flushed(set(low), dtype, scale, scaled.transforms if scaled is not None else None)
    if scaled is not None:
        scaled.weight_gradients(flushed)
    for name in low_params & set(flushed):  # the weight gradient itself is a low-precision GEMM's output
        flushed[name] = torch.where(flushes(flushed[name], dtype, scale), torch.zeros_like(flushed[name]), flushed[name])
    output_max = {path: max((float(g.abs().max()) for g in backward.output_grads.get(path, []) if g.numel()),
                            default=0.0) for path in low}
    updates, state = optimizer_updates(request, reference, flushed)
    return ModeStatistics(mode, scale, skipped, low, low_params, output_max, spread, flushed, updates, state,
                          scaled=scaled.statistics if scaled is not None else {})


def settled_scale(largest: float, scaler, dtype: torch.dtype):
    """(the loss scale, the steps skipped to reach it): 1 without a scaler; else the initial scale halved
    (by the backoff factor) until the largest gradient stays finite in ``dtype``."""
    if scaler is None:
        return 1.0, 0
    scale, skipped = float(scaler["init_scale"]), 0
    backoff = scaler.get("backoff_factor", 0.5)
    while largest > 0 and bool(overflows(torch.tensor(largest, dtype=torch.float64), dtype, scale)) and skipped < 64:
        scale *= backoff
        skipped += 1
    return scale, skipped


def optimizer_updates(request: StepRequest, reference: TrainingReference,
                      grads: Dict[str, torch.Tensor]):
    """(the update, the state tensors) a fresh float64 optimizer makes from the step's starting weights with ``grads``."""
    before = {name: p.before for name, p in reference.step.parameters.items()}
    weights = [torch.nn.Parameter(before[name].clone()) for name in before]
    optimizer = request.step.make_optimizer(weights)
    for (name, _), w in zip(before.items(), weights):
        w.grad = grads.get(name, torch.zeros_like(w)).to(w.dtype).clone()
    optimizer.step()
    updates = {name: (w.detach() - before[name]) for name, w in zip(before, weights)}
    state = {name: {key: value.detach() for key, value in optimizer.state.get(w, {}).items()
                    if isinstance(value, torch.Tensor) and value.numel() == w.numel()}
             for name, w in zip(before, weights)}
    return updates, state
