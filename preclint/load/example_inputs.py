"""The example call the model's code provides (a module-level ``example_inputs``, else the model's
``example_input_array``), and the check that an example call, provided or drawn, fits ``forward()``."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any, List, Sequence

import torch
from torch import nn

from preclint.core.errors import UserError
from preclint.load.messages import located, quote
from preclint.load.modelio import Inputs, output_tensors
from preclint.load.target import Origin

# Module-level names with a meaning, in the order they are looked for.
EXAMPLE_INPUTS_ATTR = "example_inputs"
EXAMPLE_INPUT_ARRAY_ATTR = "example_input_array"  # PyTorch Lightning's convention


def inputs_from_code(origin: Origin, module: nn.Module, seed: int) -> Inputs:
    """Inputs the code provides: module-level ``example_inputs``, else ``model.example_input_array``."""
    if hasattr(origin.namespace, EXAMPLE_INPUTS_ATTR):
        provided = getattr(origin.namespace, EXAMPLE_INPUTS_ATTR)
        source = f"{origin.label}: {EXAMPLE_INPUTS_ATTR}"
        if callable(provided) and not isinstance(provided, (torch.Tensor, nn.Module)):
            torch.manual_seed(seed)
            try:
                provided = provided()
            except (Exception, SystemExit) as exc:
                where = located(origin.label, origin.file_path, exc.__traceback__)
                raise UserError(f"{where}: {EXAMPLE_INPUTS_ATTR}() failed: {quote(exc)}") from None
            source += "()"
        return _as_call(provided, source, pair_is_call=True)

    provided = getattr(module, EXAMPLE_INPUT_ARRAY_ATTR, None)
    if provided is not None:
        # Lightning's own reading: a tuple or list is the positional inputs, a dict the keywords
        return _as_call(provided, f"{origin.label}: {EXAMPLE_INPUT_ARRAY_ATTR}", pair_is_call=False)

    raise UserError(
        f"{origin.label}: no example inputs; pass --input (e.g. --input 1x3x224x224, "
        "--input input_ids=1x128:int64), "
        f"define `{EXAMPLE_INPUTS_ATTR} = (...)` in the file, "
        f"or set `{EXAMPLE_INPUT_ARRAY_ATTR}` on the model"
    )


def _as_call(provided: Any, source: str, pair_is_call: bool) -> Inputs:
    """The example inputs as one call ``model(*args, **kwargs)``.

    A Tensor is the one input, a dict the keyword inputs, a tuple or list the positional inputs.
    With ``pair_is_call``, a 2-tuple of a tuple/list and a dict is ``(args, kwargs)``, as
    torch.export takes them; a sequence and a dict that are two positional inputs are then
    written ``((sequence, mapping), {})``.
    """
    if isinstance(provided, torch.Tensor):
        return Inputs((provided,))
    if isinstance(provided, Mapping):
        return Inputs((), _keywords(provided, source))
    if (pair_is_call and isinstance(provided, tuple) and len(provided) == 2
            and isinstance(provided[0], (tuple, list)) and isinstance(provided[1], Mapping)):
        args, kwargs = provided
        return Inputs(_positional(args, f"{source}[0]"), _keywords(kwargs, f"{source}[1]"))
    if isinstance(provided, (tuple, list)):
        return Inputs(_positional(provided, source))
    raise UserError(
        f"{source} is {_a(type(provided).__name__)}; expected a Tensor, a tuple of positional inputs, "
        "a dict of keyword inputs" + (" or (args, kwargs)" if pair_is_call else "")
    )


def _positional(values: Sequence[Any], source: str) -> tuple:
    for position, value in enumerate(values):
        _check_input_value(value, f"{source}[{position}]")
    return tuple(values)


def _keywords(values: Mapping, source: str) -> dict:
    for key, value in values.items():
        if not isinstance(key, str):
            raise UserError(f"{source} has the key {key!r}; keyword inputs are named by strings")
        _check_input_value(value, f"{source}[{key!r}]")
    return dict(values)


_SCALAR_INPUTS = (bool, int, float, str)


def _check_input_value(value: Any, where: str) -> None:
    if value is None or isinstance(value, (torch.Tensor,) + _SCALAR_INPUTS):
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _check_input_value(item, f"{where}[{key!r}]")
        return
    if isinstance(value, (list, tuple)):
        for position, item in enumerate(value):
            _check_input_value(item, f"{where}[{position}]")
        return
    if output_tensors(value):  # a container of tensors (a transformers Cache, a dataclass): they are inputs
        return
    raise UserError(
        f"{where} is {_a(type(value).__name__)}; an input is a Tensor, None, a number or a string, "
        "or a list, tuple, dict or object holding them (a transformers Cache)"
    )


def check_call_fits(module: nn.Module, call: Inputs, label: str) -> List[str]:
    """Fail early, in the user's words, when the inputs cannot bind to the model's forward(); a
    note for keywords that only ``**kwargs`` takes and that look like a misspelt parameter."""
    forward = f"{type(module).__name__}.forward()"
    try:
        parameters = inspect.signature(module.forward).parameters
    except ValueError:  # no signature to check against: the run will tell
        return []
    named = [p.name for p in parameters.values() if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    gathered = [p.name for p in parameters.values() if p.kind == p.VAR_KEYWORD]
    unknown = [name for name in call.kwargs if name not in named]
    if unknown and not gathered:
        listed = ", ".join(named[:_MAX_LISTED_PARAMETERS]) + (", ..." if len(named) > _MAX_LISTED_PARAMETERS else "")
        raise UserError(
            f"{label}: {forward} has no parameter {unknown[0]!r}{_did_you_mean(unknown[0], named)} "
            f"(its parameters: {listed or 'none'})"
        )
    try:
        call.bind(module.forward)
    except TypeError as exc:
        raise UserError(f"{label}: {forward} does not take the example inputs ({call.describe()}): {exc}") from None
    return [
        f"{name} is not a parameter of {forward}{hint}; it went to **{gathered[0]}"
        for name in unknown
        if (hint := _did_you_mean(name, named, cutoff=0.8))
    ]


_MAX_LISTED_PARAMETERS = 8


def _did_you_mean(name: str, names: Sequence[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
