"""The example call the model's code provides (a module-level ``example_inputs``, else the model's
``example_input_array``), and the check that an example call, provided or drawn, fits ``forward()``."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping
from typing import Any, List, Optional, Sequence

import torch
from torch import nn

from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.available_memory import format_bytes
from preclint.load.input_specs import physical_memory
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
        return Inputs(_positional((provided,), source))
    if isinstance(provided, Mapping):
        return Inputs((), _keywords(provided, source))
    if (pair_is_call and isinstance(provided, tuple) and len(provided) == 2
            and isinstance(provided[0], (tuple, list)) and isinstance(provided[1], Mapping)):
        args, kwargs = provided
        walk = _InputWalk(source)  # one size for the two
        return Inputs(_positional(args, f"{source}[0]", walk), _keywords(kwargs, f"{source}[1]", walk))
    if isinstance(provided, (tuple, list)):
        return Inputs(_positional(provided, source))
    raise UserError(
        f"{source} is {_a(type(provided).__name__)}; expected a Tensor, a tuple of positional inputs, "
        "a dict of keyword inputs" + (" or (args, kwargs)" if pair_is_call else "")
    )


def checked_call(call: Inputs, source: str) -> Inputs:
    """``call`` (inputs handed over as objects, by the Python API) held to the bounds of example inputs
    in a file: nesting, self-reference, item count and the memory of their copies."""
    walk = _InputWalk(source)
    return Inputs(_positional(call.args, source, walk), _keywords(call.kwargs, source, walk))


def _positional(values: Sequence[Any], source: str, walk: Optional["_InputWalk"] = None) -> tuple:
    walk = walk or _InputWalk(source)
    walk.open.add(id(values))
    for position, value in enumerate(values):
        walk.check(value, f"{source}[{position}]", 1)
    walk.check_size()
    return tuple(values)


def _keywords(values: Mapping, source: str, walk: Optional["_InputWalk"] = None) -> dict:
    walk = walk or _InputWalk(source)
    walk.open.add(id(values))
    for key, value in values.items():
        if not isinstance(key, str):
            raise UserError(f"{source} has the key {_shown_key(key)}; keyword inputs are named by strings")
        walk.check(value, f"{source}[{key!r}]", 1)
    walk.check_size()
    return dict(values)


_SCALAR_INPUTS = (bool, int, float, str)
# How far example inputs may nest and how many items they may hold: a model's inputs are tensors in
# containers a few levels deep (past key values: a tuple of tuples), and every pass walks them again,
# recursively (pytree, preclint's own trees), so a deeper or larger structure is refused in one line.
MAX_INPUT_DEPTH = 32
MAX_INPUT_ITEMS = 1_000_000


class _InputWalk:
    """The check of one example call's values, depth first: what each value is, how deep it nests and
    whether a container holds itself (on the way down), how many items there are, and what the tensors
    take as tensors of their own (the check copies each input; an ``expand`` view counts every element
    it shows)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.items = 0
        self.nbytes = 0
        self.open: set = set()  # ids of the containers on the way down

    def check(self, value: Any, where: str, depth: int) -> None:
        self.items += 1
        if self.items > MAX_INPUT_ITEMS:
            raise UserError(f"{self.source} holds more than {MAX_INPUT_ITEMS:,} values; "
                            "an example call is a few tensors, in lists, tuples or dicts")
        if isinstance(value, torch.Tensor):
            self.nbytes += value.numel() * value.element_size()
            return
        if value is None or isinstance(value, _SCALAR_INPUTS):
            return
        if not isinstance(value, (dict, list, tuple)):
            held = output_tensors(value)
            if held:  # a container of tensors (a transformers Cache, a dataclass): they are inputs
                self.nbytes += sum(t.numel() * t.element_size() for t in held)
                return
            raise UserError(
                f"{where} is {_a(type(value).__name__)}; an input is a Tensor, None, a number or a string, "
                "or a list, tuple, dict or object holding them (a transformers Cache)"
            )
        if id(value) in self.open:
            raise UserError(f"{where} is a {type(value).__name__} that holds itself; example inputs must be a tree")
        if depth >= MAX_INPUT_DEPTH:
            raise UserError(f"{self.source} nests deeper than {MAX_INPUT_DEPTH} levels of lists, tuples and dicts; "
                            "example inputs nest a few levels")
        self.open.add(id(value))
        try:
            if isinstance(value, dict):
                for key, item in value.items():
                    self.check(item, f"{where}[{_shown_key(key)}]", depth + 1)
            else:
                for position, item in enumerate(value):
                    self.check(item, f"{where}[{position}]", depth + 1)
        finally:
            self.open.discard(id(value))

    def check_size(self) -> None:
        """Inputs that would not fit in this machine's memory as tensors of their own are refused
        before the check copies them (``torch.zeros(1).expand(10**12)`` is 4 bytes as a view, 4 TB
        as a copy)."""
        available = physical_memory()
        if available is not None and self.nbytes > available:
            raise UserError(f"{self.source} takes {format_bytes(self.nbytes)} as tensors of their own (an expanded "
                            f"view counts every element it shows), more than this machine's memory "
                            f"({format_bytes(available)}); use smaller inputs")


def _shown_key(key: Any) -> str:
    """A dict key in a message: its repr, cut short (a key can be any object, with any repr)."""
    try:
        shown = repr(key)
    except Exception:  # a key whose __repr__ fails
        shown = f"<{type(key).__name__}>"
    return shown if len(shown) <= 80 else shown[:77] + "..."



def check_call_fits(module: nn.Module, call: Inputs, label: str) -> List[Note]:
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
        Note("load", f"{name} is not a parameter of {forward}{hint}; it went to **{gathered[0]}")
        for name in unknown
        if (hint := _did_you_mean(name, named, cutoff=0.8))
    ]


_MAX_LISTED_PARAMETERS = 8


def _did_you_mean(name: str, names: Sequence[str], cutoff: float = 0.6) -> str:
    close = difflib.get_close_matches(name, names, n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"
