"""What a training step needs beside the model and its inputs, as the model's file gives it (``--train``):

    def loss_fn(output, target): ...        # or a model that returns its loss (output.loss, a scalar)
    example_targets = torch.randn(64, 1)     # or a function that returns them
    def make_optimizer(params): return torch.optim.AdamW(params, lr=1e-3)   # or optimizer = ...
    scaler = torch.amp.GradScaler("cuda")    # optional: the loss scale the step starts with

The step is rebuilt on copies of the model, never on the user's own: the optimizer as a factory of
parameters (an optimizer instance is read as its class and hyperparameters), the scaler as its settings.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

import torch

from preclint.core.errors import UserError
from preclint.load.messages import located, quote

LOSS_ATTR = "loss_fn"
TARGETS_ATTR = "example_targets"
OPTIMIZER_FACTORY_ATTR = "make_optimizer"
OPTIMIZER_ATTR = "optimizer"
SCALER_ATTR = "scaler"


@dataclass
class TrainingStep:
    """One training step's pieces: ``loss_fn(output, targets)`` (None: the model returns its loss),
    ``make_optimizer(params)``, and the GradScaler's settings (None: no loss scaling)."""

    make_optimizer: Callable[[Any], torch.optim.Optimizer]
    loss_fn: Optional[Callable[[Any, Any], Any]] = None
    targets: Any = None
    scaler: Optional[Dict[str, Any]] = None  # init_scale, growth_factor, backoff_factor, growth_interval
    label: str = "the training step"
    notes: list = field(default_factory=list)

    @property
    def loss_scale(self) -> float:
        """The loss scale of the step's first iteration (1: no scaler)."""
        return float(self.scaler["init_scale"]) if self.scaler else 1.0


def training_step_of(*, loss_fn=None, targets=None, make_optimizer=None, optimizer=None, scaler=None,
                     label: str = "preclint.check") -> TrainingStep:
    """The step from its pieces, checked: what the file's names and ``preclint.training_step`` give."""
    if make_optimizer is None and optimizer is None:
        raise UserError(f"{label}: --train needs the optimizer: define `{OPTIMIZER_FACTORY_ATTR}(params)` "
                        f"(e.g. return torch.optim.AdamW(params, lr=1e-3)) or `{OPTIMIZER_ATTR} = ...`")
    if make_optimizer is not None and not callable(make_optimizer):
        raise UserError(f"{label}: {OPTIMIZER_FACTORY_ATTR} is a {type(make_optimizer).__name__}; "
                        "expected a function of the parameters that returns an optimizer")
    if make_optimizer is None:
        make_optimizer = optimizer_factory(optimizer, label)
    if loss_fn is not None and not callable(loss_fn):
        raise UserError(f"{label}: {LOSS_ATTR} is a {type(loss_fn).__name__}; expected loss_fn(output, target)")
    if loss_fn is not None and targets is None:
        raise UserError(f"{label}: {LOSS_ATTR} needs `{TARGETS_ATTR}` (the targets of the example inputs)")
    return TrainingStep(make_optimizer, loss_fn, targets, scaler_settings(scaler, label), label)


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
    """The step the model's file defines (module-level names, see the module's docstring); the optimizer
    may come from the model's Lightning-style ``configure_optimizers()`` instead."""
    targets = getattr(namespace, TARGETS_ATTR, None)
    if callable(targets) and not isinstance(targets, torch.Tensor):
        torch.manual_seed(seed)
        try:
            targets = targets()
        except (Exception, SystemExit) as exc:
            raise UserError(f"{located(label, file_path, exc.__traceback__)}: {TARGETS_ATTR}() failed: {quote(exc)}") from None
    return training_step_of(loss_fn=getattr(namespace, LOSS_ATTR, None), targets=targets,
                            make_optimizer=getattr(namespace, OPTIMIZER_FACTORY_ATTR, None),
                            optimizer=getattr(namespace, OPTIMIZER_ATTR, None) or configured_optimizer(module, label),
                            scaler=getattr(namespace, SCALER_ATTR, None), label=label)


def configured_optimizer(module: Any, label: str) -> Optional[torch.optim.Optimizer]:
    """The first optimizer a Lightning-style ``module.configure_optimizers()`` returns (an optimizer, a list
    or tuple of them, ``([optimizers], [schedulers])`` or ``{"optimizer": ...}``); None without the method.
    Building an optimizer reads the parameters and changes nothing."""
    configure = getattr(module, "configure_optimizers", None)
    if not callable(configure):
        return None
    try:
        found = configure()
    except Exception as exc:  # noqa: BLE001 - the user's code: one line
        raise UserError(f"{label}: configure_optimizers() failed: {quote(exc)}") from None
    while isinstance(found, (list, tuple)) and found:
        found = found[0]
    if isinstance(found, dict):
        found = found.get("optimizer")
    return found if isinstance(found, torch.optim.Optimizer) else None
