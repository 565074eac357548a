"""Finding and building the model in the target's namespace: the one ``--model NAME`` (or ``:NAME``)
names, else a module-level ``model``, else the one root ``nn.Module`` class of the file."""

from __future__ import annotations

import difflib
import inspect
from types import ModuleType
from typing import Any, Callable

import torch
from torch import nn

from preclint.core.errors import UserError
from preclint.load.model_classes import is_torchscript
from preclint.load.messages import located, quote, quoted_list
from preclint.load.target import Origin

# The module-level name of a model instance, looked for first when no model is named.
MODEL_ATTR = "model"


def build_named_model(origin: Origin, name: str, seed: int) -> nn.Module:
    """Build what ``--model NAME`` (or ``:NAME``) points at: an instance, a class or a factory."""
    obj = _resolve_attr(origin, name)
    if isinstance(obj, nn.Module):
        return obj
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return _build(origin, name, obj, seed)
    if callable(obj):
        built = _build(origin, name, obj, seed)
        if not isinstance(built, nn.Module):
            raise UserError(
                f"{origin.label}: {name}() returned {type(built).__name__}, not an nn.Module"
            )
        return built
    raise UserError(
        f"{origin.label}: {name!r} is a {type(obj).__name__}, not an nn.Module, "
        "an nn.Module subclass or a zero-argument factory"
    )


def _resolve_attr(origin: Origin, name: str) -> Any:
    """Look up ``name`` (dotted names walk attributes) and suggest close names when it is missing."""
    obj: Any = origin.namespace
    walked: list[str] = []
    for part in name.split("."):
        if not hasattr(obj, part):
            owner = ".".join(walked) if walked else None
            candidates = [n for n in dir(obj) if not n.startswith("_")]
            close = difflib.get_close_matches(part, candidates, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where = f"{origin.label}: {owner!r}" if owner else origin.label
            raise UserError(f"{where} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
        walked.append(part)
    return obj


def find_model(origin: Origin, seed: int) -> tuple[str, nn.Module]:
    """Pick the model when none is named: ``model = ...``, else the one root class of the file."""
    instance = getattr(origin.namespace, MODEL_ATTR, None)
    if isinstance(instance, nn.Module):
        return MODEL_ATTR, instance

    classes = _module_classes_defined_in(origin.namespace)
    if not classes:
        raise UserError(
            f"{origin.label}: no nn.Module found (looked for --model NAME, a module-level "
            f"nn.Module instance named {MODEL_ATTR!r}, and nn.Module subclasses defined in it)"
        )

    buildable = {name: cls for name, cls in classes.items() if not _missing_arguments(cls)}
    if not buildable:
        needs = "; ".join(
            f"{name}() needs arguments (missing: {quoted_list(_missing_arguments(cls))})"
            for name, cls in classes.items()
        )
        raise UserError(
            f"{origin.label}: {needs}; define `{MODEL_ATTR} = {next(iter(classes))}(...)` "
            "in the file or pass --model with a zero-argument factory"
        )

    # Build every candidate; one that appears inside another (Block inside Net) is not the model.
    instances = {name: _build(origin, name, cls, seed, several=len(buildable) > 1)
                 for name, cls in buildable.items()}
    for name, instance in instances.items():
        require_initialised(origin.label, instance)
    contained_types = {
        type(sub)
        for instance in instances.values()
        for sub in instance.modules()
        if sub is not instance
    }
    roots = [name for name, cls in buildable.items() if cls not in contained_types]
    if len(roots) == 1:
        return roots[0], instances[roots[0]]
    if not roots:  # every class contains another (mutual nesting): nothing stands out
        roots = list(buildable)
    raise UserError(
        f"{origin.label}: several candidate models ({', '.join(roots)}); "
        "pass --model NAME to choose one"
    )


def require_initialised(label: str, module: nn.Module) -> None:
    """A module whose ``__init__`` never ran ``nn.Module.__init__`` has no registry of submodules,
    so every walk of the model (``modules()``, ``eval()``) fails on it: say which one."""
    stack, seen = [module], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        if is_torchscript(current):  # its submodules live in the TorchScript object, not in vars()
            continue
        children = vars(current).get("_modules")
        if children is None:
            raise UserError(f"{label}: {type(current).__name__} was never initialised as an nn.Module "
                            "(its __init__ does not call super().__init__())")
        stack.extend(child for child in children.values() if child is not None)


def _module_classes_defined_in(namespace: ModuleType) -> dict[str, type]:
    """nn.Module subclasses defined in this module itself (not imported), in definition order."""
    found: dict[str, type] = {}
    seen: set[int] = set()
    for name, obj in vars(namespace).items():
        if (
            isinstance(obj, type)
            and issubclass(obj, nn.Module)
            and obj.__module__ == namespace.__name__
            and id(obj) not in seen  # an alias (Model = Net) is the same class
        ):
            seen.add(id(obj))
            found[name] = obj
    return found


def _build(origin: Origin, name: str, factory: Callable[[], Any], seed: int,
           several: bool = False) -> Any:
    """Call a class or factory with no arguments, seeded, turning failures into one line."""
    missing = _missing_arguments(factory)
    if missing:
        raise UserError(
            f"{origin.label}: {name}() needs arguments (missing: {quoted_list(missing)}); "
            f"define `{MODEL_ATTR} = {name}(...)` in the file or pass --model with a zero-argument factory"
        )
    # Re-seeded per build, so a model found among several candidates has the same weights
    # as the same model named with --model.
    torch.manual_seed(seed)
    try:
        return factory()
    except (Exception, SystemExit) as exc:
        hint = " (pass --model NAME to choose another model)" if several else ""
        where = located(origin.label, origin.file_path, exc.__traceback__)
        raise UserError(f"{where}: building {name}() failed: {quote(exc)}{hint}") from None


def _missing_arguments(factory: Callable[..., Any]) -> list[str]:
    """Names of the parameters a no-argument call would lack; [] if unknown (we then just try)."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return []
    required_kinds = (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        inspect.Parameter.KEYWORD_ONLY,
    )
    return [
        param.name
        for param in signature.parameters.values()
        if param.kind in required_kinds and param.default is inspect.Parameter.empty
    ]
