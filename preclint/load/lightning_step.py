"""A PyTorch Lightning module's training step, for ``--train`` (docs/training.md, "PyTorch Lightning"):

    class Model(lightning.LightningModule):
        def training_step(self, batch, batch_idx): ...      # returns the loss (or {"loss": ...})
        def configure_optimizers(self): ...                  # any form Lightning takes
    model = Model()
    example_batch = (torch.randn(64, 32), torch.randn(64, 1))   # or: the module's train_dataloader(),
                                                                #     or datamodule = MyDataModule()

The loss is ``training_step(batch, 0)`` on the example batch (the file's ``example_batch``, else the first
batch of ``datamodule.train_dataloader()``, else of the module's own ``train_dataloader()``); the optimizer is
the first that ``configure_optimizers()`` returns, rebuilt with its parameter groups on preclint's copies.
Lightning itself is never imported: a module is recognised by its classes' names, and any module with a
``training_step`` steps this way where the file gives its ``example_batch`` and no ``loss_fn``.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.messages import located, quote

BATCH_ATTR = "example_batch"
DATAMODULE_ATTR = "datamodule"
LIGHTNING_PACKAGES = ("lightning", "pytorch_lightning")
BATCH_IDX = 0


def is_lightning_module(module: Any) -> bool:
    """Whether ``module`` is a LightningModule (of ``lightning`` or ``pytorch_lightning``), without importing either."""
    return any(cls.__name__ == "LightningModule" and cls.__module__.split(".")[0] in LIGHTNING_PACKAGES
               for cls in type(module).__mro__)


def steps_itself(namespace: Any, module: Any) -> bool:
    """Whether the loss is the module's ``training_step``: a LightningModule, or a module with a
    ``training_step`` whose file gives ``example_batch``; never where the file gives its own ``loss_fn``."""
    if getattr(namespace, "loss_fn", None) is not None or not callable(getattr(module, "training_step", None)):
        return False
    return is_lightning_module(module) or getattr(namespace, BATCH_ATTR, None) is not None


def _user_defined(module: Any, name: str) -> bool:
    """Whether ``module``'s class (or a base outside Lightning) defines ``name``: Lightning's own
    ``train_dataloader`` only raises."""
    for cls in type(module).__mro__:
        if name in vars(cls):
            return cls.__module__.split(".")[0] not in LIGHTNING_PACKAGES
    return False


def example_batch(namespace: Any, module: Any, label: str, file_path: Optional[str], seed: int) -> Any:
    """The batch ``training_step`` is checked on (see the module's docstring)."""
    if getattr(module, "automatic_optimization", True) is False:
        raise UserError(f"{label}: the module sets automatic_optimization = False (its training_step steps its own "
                        "optimizers); --train needs a training_step that returns its loss")
    torch.manual_seed(seed)
    given = getattr(namespace, BATCH_ATTR, None)
    if given is not None:
        if callable(given) and not isinstance(given, torch.Tensor):
            try:
                return given()
            except (Exception, SystemExit) as exc:
                raise UserError(f"{located(label, file_path, exc.__traceback__)}: {BATCH_ATTR}() failed: "
                                f"{quote(exc)}") from None
        return given
    datamodule = getattr(namespace, DATAMODULE_ATTR, None)
    if datamodule is not None:
        return _first_batch(datamodule, "datamodule", label, prepare=True)
    if _user_defined(module, "train_dataloader"):
        return _first_batch(module, "the module", label, prepare=False)
    raise UserError(f"{label}: --train runs {type(module).__name__}.training_step(batch, batch_idx) and needs a "
                    f"batch: define `{BATCH_ATTR} = ...` (what your train_dataloader yields), "
                    f"`{DATAMODULE_ATTR} = ...`, or the module's train_dataloader()")


def _first_batch(owner: Any, what: str, label: str, prepare: bool) -> Any:
    """The first batch of ``owner.train_dataloader()`` (a datamodule is prepared and set up for fit first)."""
    step = "prepare_data()"
    try:
        if prepare and callable(getattr(owner, "prepare_data", None)):
            owner.prepare_data()
        step = 'setup("fit")'
        if prepare and callable(getattr(owner, "setup", None)):
            owner.setup("fit")
        step = "train_dataloader()"
        loader = owner.train_dataloader()
        step = "first batch"
        return next(iter(loader))
    except StopIteration:
        raise UserError(f"{label}: {what}'s train_dataloader() yields no batch") from None
    except (Exception, SystemExit) as exc:
        raise UserError(f"{label}: {what}'s {step} failed: {quote(exc)}") from None


# -- the optimizer -----------------------------------------------------------------------------------------

def _split(found: Any) -> Tuple[List[Any], List[Any]]:
    """(optimizers, schedulers) of what ``configure_optimizers()`` returned, in every form Lightning takes:
    an optimizer; a list or tuple of them; ``{"optimizer": ..., "lr_scheduler": ...}`` or a list of such
    dicts; ``([optimizers], [schedulers])``."""
    if found is None:
        return [], []
    if isinstance(found, dict):
        scheduler = found.get("lr_scheduler")
        return ([found["optimizer"]] if "optimizer" in found else []), ([] if scheduler is None else [scheduler])
    if isinstance(found, (list, tuple)):
        if len(found) == 2 and all(isinstance(part, (list, tuple)) for part in found):
            return list(found[0]), list(found[1])
        optimizers, schedulers = [], []
        for item in found:
            more, later = _split(item)
            optimizers += more
            schedulers += later
        return optimizers, schedulers
    return [found], []


def configured_optimizer(module: Any, label: str) -> Tuple[Optional[Callable], List[Note]]:
    """(a factory of the optimizer ``module.configure_optimizers()`` returns, notes); (None, []) without the method."""
    configure = getattr(module, "configure_optimizers", None)
    if not callable(configure):
        return None, []
    try:
        found = configure()
    except Exception as exc:  # noqa: BLE001 - the user's code: one line
        raise UserError(f"{label}: configure_optimizers() failed: {quote(exc)}") from None
    optimizers, schedulers = _split(found)
    if not optimizers:
        if is_lightning_module(module):
            raise UserError(f"{label}: configure_optimizers() returned no optimizer; --train needs one")
        return None, []
    optimizer = optimizers[0]
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserError(f"{label}: configure_optimizers() gave a {type(optimizer).__name__}, not a torch.optim.Optimizer")
    notes: List[Note] = []
    if len(optimizers) > 1:
        notes.append(Note("training", f"{label}: configure_optimizers() gives {len(optimizers)} optimizers; the "
                                      f"training step uses the first, {type(optimizer).__name__}"))
    factory, lr_note = grouped_factory(optimizer, module, label)
    if schedulers or lr_note:
        notes.append(Note("training", f"{label}: the step runs at the learning rate {type(optimizer).__name__}'s "
                                      f"groups have after configure_optimizers() ({lr_note or _rates(optimizer)}), the "
                                      "first step's"))
    return factory, notes


def _rates(optimizer: torch.optim.Optimizer) -> str:
    return ", ".join(f"lr={group.get('lr'):g}" for group in optimizer.param_groups if isinstance(group.get("lr"), float))


def _accepted(cls: type) -> Optional[set]:
    """The keyword arguments ``cls``'s constructor takes (None: any)."""
    try:
        parameters = inspect.signature(cls.__init__).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None
    return {p.name for p in parameters} - {"self", "params"}


def grouped_factory(optimizer: torch.optim.Optimizer, module: Any, label: str) -> Tuple[Callable, str]:
    """(a factory that builds ``optimizer``'s class with its parameter groups on another copy of ``module``'s
    trainable parameters, a note where a group's learning rate is 0 and its scheduler's base rate is used).

    A group is remembered by its parameters' positions among the module's trainable parameters (preclint's
    copies hand theirs over in that order); its settings are those the constructor takes (a scheduler's
    ``initial_lr`` is not one)."""
    order = [p for p in module.parameters() if p.requires_grad]
    index = {id(p): i for i, p in enumerate(order)}
    accepted = _accepted(type(optimizer))
    groups: List[Tuple[List[int], Dict[str, Any]]] = []
    note = ""
    for group in optimizer.param_groups:
        settings = {k: v for k, v in group.items() if k != "params" and (accepted is None or k in accepted)}
        if settings.get("lr") == 0 and isinstance(group.get("initial_lr"), float) and group["initial_lr"] > 0:
            # a warm-up from 0: a step at lr 0 moves nothing, so the base rate is the one to check
            settings["lr"] = group["initial_lr"]
            note = f"a group's lr is 0 at the first step; checked at its scheduler's base lr={group['initial_lr']:g}"
        positions = [index[id(p)] for p in group["params"] if id(p) in index]
        if positions:
            groups.append((positions, settings))
    if not groups:
        raise UserError(f"{label}: configure_optimizers()'s {type(optimizer).__name__} holds none of the module's "
                        "trainable parameters")
    cls = type(optimizer)

    def make(params):
        params = list(params)
        if len(params) != len(order):  # not a copy of the module: one group of the first group's settings
            return cls(params, **groups[0][1])
        return cls([{"params": [params[i] for i in positions], **settings} for positions, settings in groups])

    return make, note
