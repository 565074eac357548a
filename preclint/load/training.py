"""What a training step needs beside the model and its inputs, as the model's file gives it (``--train``):

    def loss_fn(output, target): ...        # or a model that returns its loss (output.loss, a scalar)
    example_targets = torch.randn(64, 1)     # or a function that returns them
    def make_optimizer(params): return torch.optim.AdamW(params, lr=1e-3)   # or optimizer = ...
    scaler = torch.amp.GradScaler("cuda")    # optional: the loss scale the step starts with

A Lightning module gives the loss by its ``training_step(batch, batch_idx)`` on an example batch and the
optimizer by ``configure_optimizers()`` (load/lightning_step.py).

The step is rebuilt on copies of the model, never on the user's own: the optimizer as a factory of
parameters (an optimizer instance is read as its class and hyperparameters), the scaler as its settings.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional

import torch

from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.lightning_step import (BATCH_IDX, configured_optimizer, example_batch, is_lightning_module,
                                          steps_itself)
from preclint.load.messages import located, quote
from preclint.load.modelio import Inputs

LOSS_ATTR = "loss_fn"
TARGETS_ATTR = "example_targets"
OPTIMIZER_FACTORY_ATTR = "make_optimizer"
OPTIMIZER_ATTR = "optimizer"
SCALER_ATTR = "scaler"
# torch.amp.GradScaler's defaults, which Lightning's MixedPrecision("16-mixed") builds
LIGHTNING_SCALER = {"init_scale": 2.0 ** 16, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000}


@dataclass
class TrainingStep:
    """One training step's pieces: ``loss_fn(output, targets)`` (None: the model returns its loss),
    ``make_optimizer(params)``, and the GradScaler's settings (None: no loss scaling)."""

    make_optimizer: Optional[Callable[[Any], torch.optim.Optimizer]]  # None: the module's configure_optimizers()
    loss_fn: Optional[Callable[[Any, Any], Any]] = None
    targets: Any = None
    scaler: Optional[Dict[str, Any]] = None  # init_scale, growth_factor, backoff_factor, growth_interval
    label: str = "the training step"
    notes: List[Note] = field(default_factory=list)
    batch: Any = None  # a Lightning module's example batch: the loss is training_step(batch, 0)
    scaled_modes: Optional[tuple] = None  # the precisions the scaler scales (None: all; Lightning's: fp16)
    scaler_given: bool = False  # a scaler was given (a disabled one has no settings)

    def scaler_for(self, mode: str) -> Optional[Dict[str, Any]]:
        """The scaler's settings where ``mode``'s step scales its loss (never the float64 reference's)."""
        if self.scaler is None or mode == "float64" or (self.scaled_modes is not None and mode not in self.scaled_modes):
            return None
        return self.scaler

    def call_inputs(self, inputs: Inputs) -> Inputs:
        """The call whose output gives the loss: the model's example inputs, or (batch, batch_idx)."""
        return inputs if self.batch is None else Inputs((self.batch, BATCH_IDX))

    def output(self, model: torch.nn.Module, inputs: Inputs) -> Any:
        """What the loss is read from: ``model`` called on ``inputs`` (``call_inputs``'s, cast for the
        run), or a Lightning module's ``training_step`` on them."""
        if self.batch is None:
            return inputs.call(model)
        with warnings.catch_warnings():  # self.log() without a Trainer warns and does nothing
            warnings.filterwarnings("ignore", message=".*self.log.*")
            output = inputs.call(model.training_step)
        if output is None:
            raise UserError(f"{self.label}: training_step returned None on the example batch (Lightning skips such "
                            "a batch); --train needs the batch's loss")
        return output

    def loss_scale(self, mode: str) -> float:
        """The loss scale of ``mode``'s first iteration (1: no scaler)."""
        scaler = self.scaler_for(mode)
        return float(scaler["init_scale"]) if scaler else 1.0


def training_step_of(*, loss_fn=None, targets=None, make_optimizer=None, optimizer=None, scaler=None, batch=None,
                     label: str = "preclint.check") -> TrainingStep:
    """The step from its pieces, checked: what the file's names and ``preclint.training_step`` give. With
    ``batch`` (a Lightning module's), the optimizer may come later, from the module (``for_module``)."""
    if batch is not None and loss_fn is not None:
        raise UserError(f"{label}: batch= is for a model whose training_step(batch, batch_idx) returns its loss; "
                        "loss_fn= and targets= are for the model's own call: give one or the other")
    if make_optimizer is None and optimizer is None and batch is None:
        raise UserError(f"{label}: --train needs the optimizer: define `{OPTIMIZER_FACTORY_ATTR}(params)` "
                        f"(e.g. return torch.optim.AdamW(params, lr=1e-3)) or `{OPTIMIZER_ATTR} = ...`")
    if make_optimizer is not None and not callable(make_optimizer):
        raise UserError(f"{label}: {OPTIMIZER_FACTORY_ATTR} is a {type(make_optimizer).__name__}; "
                        "expected a function of the parameters that returns an optimizer")
    if make_optimizer is None and optimizer is not None:
        make_optimizer = optimizer_factory(optimizer, label)
    if loss_fn is not None and not callable(loss_fn):
        raise UserError(f"{label}: {LOSS_ATTR} is a {type(loss_fn).__name__}; expected loss_fn(output, target)")
    if loss_fn is not None and targets is None:
        raise UserError(f"{label}: {LOSS_ATTR} needs `{TARGETS_ATTR}` (the targets of the example inputs)")
    step = TrainingStep(make_optimizer, loss_fn, targets, scaler_settings(scaler, label), label)
    step.batch, step.scaler_given = batch, scaler is not None
    return step


def optimizer_factory(optimizer: Any, label: str) -> Callable[[Any], torch.optim.Optimizer]:
    """A factory that builds ``optimizer``'s class with its first group's hyperparameters on other parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"{label}: {OPTIMIZER_ATTR} is a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    if len(optimizer.param_groups) > 1:
        raise UserError(f"{label}: {OPTIMIZER_ATTR} has {len(optimizer.param_groups)} parameter groups; give "
                        f"`{OPTIMIZER_FACTORY_ATTR}(params)` instead, which preclint calls on its copies of the model")
    settings = {k: v for k, v in optimizer.param_groups[0].items() if k != "params"}
    cls = type(optimizer)

    def make(params):
        try:
            return cls(params, **settings)
        except TypeError:  # a group key the constructor does not take (initial_lr of a scheduler, ...)
            return cls(params, **{k: v for k, v in optimizer.defaults.items()})

    return make


def scaler_settings(scaler: Any, label: str) -> Optional[Dict[str, Any]]:
    if scaler is None:
        return None
    if not isinstance(scaler, (torch.amp.GradScaler,)) and type(scaler).__name__ != "GradScaler":
        raise UserError(f"{label}: {SCALER_ATTR} is a {type(scaler).__name__}, not a torch.amp.GradScaler")
    if not scaler.is_enabled():
        return None
    return {"init_scale": float(scaler._init_scale if scaler._scale is None else scaler.get_scale()),
            "growth_factor": scaler._growth_factor, "backoff_factor": scaler._backoff_factor,
            "growth_interval": scaler._growth_interval}


def training_step_from_code(namespace: Any, label: str, file_path: Optional[str], seed: int,
                            module: Any = None) -> TrainingStep:
    """The step the model's file defines (module-level names, see the module's docstring); the loss may
    come from a Lightning module's ``training_step`` and the optimizer from its ``configure_optimizers()``."""
    batch = example_batch(namespace, module, label, file_path, seed) if steps_itself(namespace, module) else None
    targets = getattr(namespace, TARGETS_ATTR, None)
    if callable(targets) and not isinstance(targets, torch.Tensor):
        torch.manual_seed(seed)
        try:
            targets = targets()
        except (Exception, SystemExit) as exc:
            raise UserError(f"{located(label, file_path, exc.__traceback__)}: {TARGETS_ATTR}() failed: {quote(exc)}") from None
    make_optimizer = getattr(namespace, OPTIMIZER_FACTORY_ATTR, None)
    optimizer = getattr(namespace, OPTIMIZER_ATTR, None)
    notes: List[Note] = []
    if make_optimizer is None and optimizer is None:
        make_optimizer, notes = configured_optimizer(module, label)
    step = training_step_of(loss_fn=getattr(namespace, LOSS_ATTR, None), targets=targets,
                            make_optimizer=make_optimizer, optimizer=optimizer,
                            scaler=getattr(namespace, SCALER_ATTR, None), label=label)
    step.batch = batch
    step.notes.extend(notes)
    if is_lightning_module(module):
        lightning_scaler(step, label)
    return step


def for_module(step: TrainingStep, module: torch.nn.Module) -> TrainingStep:
    """A step given from Python (``preclint.training_step(batch=...)``) completed from the model it trains:
    the loss is its ``training_step``, the optimizer its ``configure_optimizers()``'s where none was given,
    the scaler a Lightning module's. The step given is left as it is."""
    if step.batch is None:
        return step
    if not callable(getattr(module, "training_step", None)):
        raise UserError(f"{step.label}: batch= is the batch of the model's training_step(batch, batch_idx); "
                        f"{type(module).__name__} has none (give loss_fn= and targets= instead)")
    if getattr(module, "automatic_optimization", True) is False:
        raise UserError(f"{step.label}: the model sets automatic_optimization = False (its training_step steps its "
                        "own optimizers); --train needs a training_step that returns its loss")
    step = replace(step, notes=list(step.notes))
    if step.make_optimizer is None:
        step.make_optimizer, notes = configured_optimizer(module, step.label)
        if step.make_optimizer is None:
            raise UserError(f"{step.label}: --train needs the optimizer: give make_optimizer= or optimizer=, or "
                            "define the model's configure_optimizers()")
        step.notes.extend(notes)
    if is_lightning_module(module):
        lightning_scaler(step, step.label)
    return step


def lightning_scaler(step: TrainingStep, label: str) -> None:
    """A Lightning module's scaler scales only fp16 autocast (``precision="16-mixed"``), which always has one:
    Lightning's default GradScaler where the file gives none (a disabled one: no scaling); bf16-mixed,
    16-true and bf16-true have none."""
    step.scaled_modes = ("fp16",)
    if not step.scaler_given:
        step.scaler = dict(LIGHTNING_SCALER)
        step.notes.append(Note("training", f"{label}: fp16 is checked as Lightning's precision=\"16-mixed\" runs it, "
                                           f"with a GradScaler at init_scale={LIGHTNING_SCALER['init_scale']:g} (give "
                                           f"`{SCALER_ATTR} = ...` for another)"))
