"""Turn what the user named on the command line into a model and example inputs.

A target is a Python file (``model.py``, ``model.py:Net``) or an importable module
(``package.module`` or ``package.module:attr``). From it we pick one ``nn.Module``, build example
inputs for it, optionally load a state dict with ``weights_only=True``, and hand back a
:class:`LoadedModel` in eval mode. Every mistake a user can make ends in one
:class:`~preclint.errors.UserError` line; nothing here prints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import importlib
import importlib.machinery
import importlib.util
import inspect
import itertools
import math
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
import torch.hub
from torch import nn
from torch.overrides import TorchFunctionMode

from preclint.checkpoints import CheckpointError, assign_state_dict, meta_tensors, read_checkpoint
from preclint.errors import UserError, first_line
from preclint.modelio import Inputs

__all__ = ["LoadedModel", "load_model", "parse_shape", "parse_input"]

# Module-level names with a meaning, in the order they are looked for.
MODEL_ATTR = "model"
EXAMPLE_INPUTS_ATTR = "example_inputs"
EXAMPLE_INPUT_ARRAY_ATTR = "example_input_array"  # PyTorch Lightning's convention

# Messages quote user exceptions; they are cut so the line stays readable.
_MAX_QUOTED_CHARS = 240

# Each loaded file gets its own module name, so loading two files called model.py never collides.
_module_counter = itertools.count()


@dataclass
class LoadedModel:
    module: nn.Module  # in eval() mode
    args: tuple  # positional example inputs: tensors, None, numbers, and lists/tuples/dicts of them
    name: str  # display name: "path/model.py:Net" or "torchvision.models:resnet50"
    source_path: Optional[str]  # absolute path of the file the model was defined/loaded from
    kwargs: dict = field(default_factory=dict)  # keyword example inputs, in the same forms
    notes: list = field(default_factory=list)  # for the report: how generated inputs were drawn

    @property
    def inputs(self) -> Inputs:
        """The example call: ``module(*args, **kwargs)``."""
        return Inputs(tuple(self.args), dict(self.kwargs))


@dataclass
class _Origin:
    """Where the model comes from, in the words the messages use."""

    namespace: ModuleType
    label: str  # "path/model.py" or "torchvision.models"
    file_path: Optional[str]  # absolute path for file targets; None for module targets


def load_model(
    target: str,
    model: Optional[str] = None,
    input_shapes: Optional[Sequence[Sequence[int]]] = None,
    input_dtype: str = "float32",
    weights: Optional[str] = None,
    seed: int = 0,
    inputs: Optional[Sequence[str]] = None,
) -> LoadedModel:
    """Load the model named by ``target`` (and ``model``), with example inputs and optional weights.

    ``inputs``: ``--input`` specifications (see :func:`parse_input`); ``input_shapes``: positional
    inputs of ``input_dtype``. Either replaces the example inputs the code provides.
    """
    # Validate the cheap arguments first, so a typo in a flag fails before any user code runs.
    dtype = _parse_dtype(input_dtype)
    if inputs and input_shapes:
        raise UserError("give the inputs with --input or with --input-shape, not both")
    specs: Optional[List[InputSpec]] = None
    if inputs:
        specs = [parse_input(text, dtype) for text in inputs]
        _check_unique_names(specs)
    elif input_shapes is not None:
        specs = [InputSpec(None, _validate_shape(shape), dtype) for shape in input_shapes]
        _check_inputs_fit_in_memory(specs)
    if weights is not None:
        _check_is_file(weights, what="weights file")

    with _downloads_refused():  # user code runs in here: importing, building, example_inputs()
        origin, attr_in_target = _import_target(target, seed)
        if attr_in_target is not None and model is not None and attr_in_target != model:
            raise UserError(
                f"{target}: the model is named both in the target ({attr_in_target!r}) "
                f"and with --model ({model!r}); give only one"
            )
        model_name = attr_in_target if attr_in_target is not None else model

        if model_name is not None:
            module = _build_named_model(origin, model_name, seed)
            display_attr = model_name
        else:
            display_attr, module = _find_model(origin, seed)

        _require_initialised(origin.label, module)
        module.eval()
        if meta_tensors(module):
            # weights built on the meta device are the weights file's to give, before any run
            if weights is None:
                raise UserError(f"{origin.label}: {_first_few(meta_tensors(module))} are on the meta device (no values); "
                                "give the weights with --weights FILE (safetensors or a torch.save state dict)")
            _load_weights(module, weights)
            weights = None
        notes: List[str] = []
        if specs is not None:
            call = _drawn_inputs(module, specs, seed, notes)
        else:
            call = _example_inputs(origin, module, seed)
        notes.extend(_check_call_fits(module, call, origin.label))

    if weights is not None:
        _load_weights(module, weights)

    return LoadedModel(
        module=module,
        args=call.args,
        kwargs=call.kwargs,
        name=f"{origin.label}:{display_attr}",
        source_path=origin.file_path or _defining_file(module),
        notes=notes,
    )


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse ``"1,3,224,224"`` or ``"1x3x224x224"`` into ``(1, 3, 224, 224)``."""
    return _parse_dims(text, f"bad input shape {text!r}")


# --------------------------------------------------------------------------------------------
# Target -> module namespace


def _import_target(target: str, seed: int) -> tuple[_Origin, Optional[str]]:
    """Import the file or module that ``target`` names; return it and the ``:attr`` part, if any."""
    if not target or not target.strip():
        raise UserError("no target given: expected a Python file (model.py) or package.module[:attr]")

    # An existing path wins over any reading of a colon in it (C:\models\net.py, odd names).
    if os.path.exists(target):
        return _import_file(target, seed), None

    head, colon, attr = target.rpartition(":")
    if colon:
        if not attr:
            raise UserError(f"{target}: nothing after ':'; expected FILE.py:NAME or package.module:NAME")
        if _looks_like_path(head):
            return _import_file(head, seed), attr
        return _import_module(head, seed), attr

    if _looks_like_path(target):
        return _import_file(target, seed), None  # raises "no such file"
    return _import_module(target, seed), None


def _looks_like_path(text: str) -> bool:
    # An existing directory does not count: `mypkg:net` run beside the mypkg/ package is a module.
    return (
        text.endswith(".py")
        or os.sep in text
        or (os.altsep is not None and os.altsep in text)
        or os.path.isfile(text)
    )


def _import_file(path: str, seed: int) -> _Origin:
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory; expected a Python file (model.py) or package.module[:attr]")
    _check_is_file(path, what="file")
    label = _display_path(path)
    if not path.endswith(".py"):
        raise UserError(
            f"{label}: not a Python file; name the .py file that defines the model "
            "(pass a checkpoint with --weights)"
        )
    abs_path = os.path.abspath(path)
    directory = os.path.dirname(abs_path)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(abs_path))[0])
    module_name = f"_preclint_model_{stem}_{next(_module_counter)}"

    loader = importlib.machinery.SourceFileLoader(module_name, abs_path)
    spec = importlib.util.spec_from_file_location(module_name, abs_path, loader=loader)
    assert spec is not None  # a SourceFileLoader and a path always make a spec
    namespace = importlib.util.module_from_spec(spec)
    # Registered for good: inspect, pickle and dataclasses look classes up through sys.modules.
    sys.modules[module_name] = namespace

    try:
        with _on_sys_path(directory):
            torch.manual_seed(seed)  # module-level code may build the model or random inputs
            loader.exec_module(namespace)
    except SyntaxError as exc:
        del sys.modules[module_name]
        where = _display_path(exc.filename) if exc.filename else label
        line = f":{exc.lineno}" if exc.lineno else ""
        raise UserError(f"{where}{line}: syntax error: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise UserError(
            f"{_located(label, abs_path, exc.__traceback__)}: importing the file failed: {_quote(exc)}"
        ) from None
    return _Origin(namespace=namespace, label=label, file_path=abs_path)


def _import_module(name: str, seed: int) -> _Origin:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise UserError(
            f"no such file: {name} (and {name!r} is not a module name either; "
            "expected a Python file or package.module[:attr])"
        )
    try:
        # The console script does not put the working directory on sys.path; users expect
        # `preclint check mypkg.models:net` to find ./mypkg, as uvicorn and gunicorn do.
        with _on_sys_path(os.getcwd()):
            torch.manual_seed(seed)
            namespace = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserError(f"cannot import module {name!r}: {first_line(exc) or type(exc).__name__}") from None
        raise UserError(f"importing module {name!r} failed: {_quote(exc)}") from None
    except SyntaxError as exc:
        where = _display_path(exc.filename) if exc.filename else name
        line = f":{exc.lineno}" if exc.lineno else ""
        raise UserError(f"{where}{line}: syntax error: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        raise UserError(f"importing module {name!r} failed: {_quote(exc)}") from None
    return _Origin(namespace=namespace, label=name, file_path=None)


@contextlib.contextmanager
def _on_sys_path(directory: str) -> Iterator[None]:
    """Put ``directory`` first on sys.path while importing, so the user's sibling imports work."""
    sys.path.insert(0, directory)
    importlib.invalidate_caches()  # files written moments ago (tests, generated code) must be seen
    try:
        yield
    finally:
        # Remove only our entry: anything the user's code added to sys.path stays.
        try:
            sys.path.remove(directory)
        except ValueError:
            pass


# --------------------------------------------------------------------------------------------
# Namespace -> nn.Module


def _build_named_model(origin: _Origin, name: str, seed: int) -> nn.Module:
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


def _resolve_attr(origin: _Origin, name: str) -> Any:
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


def _find_model(origin: _Origin, seed: int) -> tuple[str, nn.Module]:
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
            f"{name}() needs arguments (missing: {_quoted_list(_missing_arguments(cls))})"
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
        _require_initialised(origin.label, instance)
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


def _require_initialised(label: str, module: nn.Module) -> None:
    """A module whose ``__init__`` never ran ``nn.Module.__init__`` has no registry of submodules,
    so every walk of the model (``modules()``, ``eval()``) fails on it: say which one."""
    stack, seen = [module], set()
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
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


def _build(origin: _Origin, name: str, factory: Callable[[], Any], seed: int,
           several: bool = False) -> Any:
    """Call a class or factory with no arguments, seeded, turning failures into one line."""
    missing = _missing_arguments(factory)
    if missing:
        raise UserError(
            f"{origin.label}: {name}() needs arguments (missing: {_quoted_list(missing)}); "
            f"define `{MODEL_ATTR} = {name}(...)` in the file or pass --model with a zero-argument factory"
        )
    # Re-seeded per build, so a model found among several candidates has the same weights
    # as the same model named with --model.
    torch.manual_seed(seed)
    try:
        return factory()
    except (Exception, SystemExit) as exc:
        hint = " (pass --model NAME to choose another model)" if several else ""
        where = _located(origin.label, origin.file_path, exc.__traceback__)
        raise UserError(f"{where}: building {name}() failed: {_quote(exc)}{hint}") from None


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


# --------------------------------------------------------------------------------------------
# Example inputs from the code


def _example_inputs(origin: _Origin, module: nn.Module, seed: int) -> Inputs:
    """Inputs the code provides: module-level ``example_inputs``, else ``model.example_input_array``."""
    if hasattr(origin.namespace, EXAMPLE_INPUTS_ATTR):
        provided = getattr(origin.namespace, EXAMPLE_INPUTS_ATTR)
        source = f"{origin.label}: {EXAMPLE_INPUTS_ATTR}"
        if callable(provided) and not isinstance(provided, (torch.Tensor, nn.Module)):
            torch.manual_seed(seed)
            try:
                provided = provided()
            except (Exception, SystemExit) as exc:
                where = _located(origin.label, origin.file_path, exc.__traceback__)
                raise UserError(f"{where}: {EXAMPLE_INPUTS_ATTR}() failed: {_quote(exc)}") from None
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
    raise UserError(
        f"{where} is {_a(type(value).__name__)}; an input is a Tensor, None, a number or a string, "
        "or a list, tuple or dict of them"
    )


def _check_call_fits(module: nn.Module, call: Inputs, label: str) -> List[str]:
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


# --------------------------------------------------------------------------------------------
# Example inputs drawn at random: --input and --input-shape


@dataclass(frozen=True)
class InputSpec:
    """One input to draw: ``--input [NAME=]SHAPE[:DTYPE[:VALUES]]``."""

    name: Optional[str]  # None: the next positional input
    shape: tuple[int, ...]
    dtype: torch.dtype
    fill: Optional[float] = None  # every element is this value
    low: Optional[float] = None  # else drawn uniformly from [low, high) when given
    high: Optional[float] = None


_INPUT_SYNTAX = "[NAME=]SHAPE[:DTYPE[:VALUES]], e.g. 1x3x224x224, input_ids=1x128:int64 or attention_mask=1x128:int64:1"
_NUMBER = r"-?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"


def parse_input(text: str, default_dtype: torch.dtype = torch.float32) -> InputSpec:
    """Parse one ``--input``: ``[NAME=]SHAPE[:DTYPE[:VALUES]]``.

    SHAPE is ``1x3x224x224`` (or ``1,3,224,224``); DTYPE a torch dtype name (``default_dtype``
    when left out); VALUES either a number that every element takes (``:1`` for an all-ones
    mask) or ``LOW..HIGH``, drawn uniformly from [LOW, HIGH).
    """
    name, eq, rest = text.partition("=")
    if not eq:
        name, rest = "", text
    name = name.strip()
    if eq and not name.isidentifier():
        raise UserError(f"bad --input {text!r}: {name!r} is not an input name; expected {_INPUT_SYNTAX}")
    parts = rest.split(":")
    if len(parts) > 3 or not parts[0].strip():
        raise UserError(f"bad --input {text!r}: expected {_INPUT_SYNTAX}")
    shape = _parse_dims(parts[0], f"bad --input {text!r}")
    dtype = _parse_dtype(parts[1]) if len(parts) > 1 and parts[1].strip() else default_dtype
    spec = InputSpec(name or None, shape, dtype)
    if len(parts) == 3:
        spec = _with_values(spec, parts[2].strip(), text)
    return spec


def _with_values(spec: InputSpec, values: str, text: str) -> InputSpec:
    integral = not (spec.dtype.is_floating_point or spec.dtype.is_complex)
    number = r"-?\d+" if integral else _NUMBER
    kind = "an integer" if integral else "a number"
    fill = re.fullmatch(number, values)
    span = re.fullmatch(rf"({number})\.\.({number})", values)
    if not fill and not span:
        raise UserError(
            f"bad --input {text!r}: VALUES {values!r} must be {kind} that every element takes, "
            f"or LOW..HIGH to draw from [LOW, HIGH)"
        )
    if fill:
        value = int(values) if integral else float(values)
        if spec.dtype == torch.bool and value not in (0, 1):
            raise UserError(f"bad --input {text!r}: a bool input takes the values 0 or 1")
        return dataclasses.replace(spec, fill=value)
    low, high = (int(v) if integral else float(v) for v in span.groups())
    if not low < high:
        raise UserError(f"bad --input {text!r}: LOW..HIGH needs LOW < HIGH (HIGH is never drawn)")
    if spec.dtype == torch.bool and (low < 0 or high > 2):
        raise UserError(f"bad --input {text!r}: a bool input takes the values 0 or 1 (0..2 draws both)")
    return dataclasses.replace(spec, low=low, high=high)


def _check_unique_names(specs: Sequence[InputSpec]) -> None:
    names = [spec.name for spec in specs if spec.name is not None]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"--input names {_quoted_list(repeated)} more than once; give each input once")


def _drawn_inputs(module: nn.Module, specs: Sequence[InputSpec], seed: int, notes: List[str]) -> Inputs:
    """Random inputs of the given shapes, dtypes and values.

    Floats are drawn from [0, 1), as torchvision's own model tests do. Integer inputs given no
    values are token ids or masks: each is drawn below the rows of the table (an embedding, mostly)
    that first looks it up, found in one run of the model on zeros (token_type_ids then stay below 2
    where input_ids reach the vocabulary), and from {0, 1} when it indexes no table: a valid mask
    (1 attends) and a valid index into anything.
    """
    open_ints = [i for i, spec in enumerate(specs) if _is_index(spec) and spec.fill is None and spec.low is None]
    rows: Dict[int, Tuple[int, str]] = {}
    if open_ints:
        rows = _embedding_rows(module, _draw(specs, seed, None), specs, open_ints)
        described = []
        for i in open_ints:
            if i in rows:
                count, weight = rows[i]
                described.append(f"{_spec_label(specs, i)} below {count}, the rows of {weight} that it indexes")
            else:
                described.append(f"{_spec_label(specs, i)} from {{0, 1}} (it indexes no table)")
        notes.append("integer inputs drawn at random: " + "; ".join(described)
                     + "; --input NAME=SHAPE:DTYPE:VALUES sets them")
    return _draw(specs, seed, {i: count for i, (count, _) in rows.items()})


def _is_index(spec: InputSpec) -> bool:
    return not (spec.dtype.is_floating_point or spec.dtype.is_complex or spec.dtype == torch.bool)


def _spec_label(specs: Sequence[InputSpec], index: int) -> str:
    if specs[index].name is not None:
        return specs[index].name
    positional = [i for i, spec in enumerate(specs) if spec.name is None]
    return "the input" if len(positional) == 1 else f"input {positional.index(index)}"


def _draw(specs: Sequence[InputSpec], seed: int, index_bounds: Optional[Dict[int, int]]) -> Inputs:
    """The inputs, seeded; open integer inputs are zeros when ``index_bounds`` is None, else drawn
    below their bound (2 where none is known)."""
    try:
        return _draw_tensors(specs, seed, index_bounds)
    except (RuntimeError, MemoryError) as exc:  # more than the memory free now, though less than installed
        if isinstance(exc, RuntimeError) and "allocate" not in str(exc):
            raise
        shown = " and ".join("x".join(map(str, spec.shape)) for spec in specs)
        raise UserError(f"cannot allocate inputs of shape {shown}: not enough free memory; use smaller inputs") from None


def _draw_tensors(specs: Sequence[InputSpec], seed: int, index_bounds: Optional[Dict[int, int]]) -> Inputs:
    torch.manual_seed(seed)
    args, kwargs = [], {}
    for i, spec in enumerate(specs):
        if spec.fill is not None:
            tensor = torch.full(spec.shape, spec.fill, dtype=spec.dtype)
        elif spec.low is not None:
            if spec.dtype.is_floating_point or spec.dtype.is_complex:
                tensor = torch.rand(spec.shape, dtype=spec.dtype) * (spec.high - spec.low) + spec.low
            else:
                tensor = torch.randint(int(spec.low), int(spec.high), spec.shape, dtype=spec.dtype)
        elif spec.dtype.is_floating_point or spec.dtype.is_complex:
            tensor = torch.rand(spec.shape, dtype=spec.dtype)
        elif index_bounds is None and _is_index(spec):
            tensor = torch.zeros(spec.shape, dtype=spec.dtype)
        else:
            bound = 2 if index_bounds is None else index_bounds.get(i, 2)
            tensor = torch.randint(0, bound, spec.shape, dtype=spec.dtype)
        if spec.name is None:
            args.append(tensor)
        else:
            kwargs[spec.name] = tensor
    return Inputs(tuple(args), kwargs)


def _embedding_rows(module: nn.Module, call: Inputs, specs: Sequence[InputSpec],
                    open_ints: Sequence[int]) -> Dict[int, Tuple[int, str]]:
    """spec index -> (rows, table name) of the first lookup that reads the input (or a view of it:
    models reshape ids first): an embedding, ``table[ids]`` or ``index_select``. One run, whose
    failure only means nothing is found: the check's own run reports it."""
    positional = iter(call.args)
    tensors = [call.kwargs[spec.name] if spec.name is not None else next(positional) for spec in specs]
    storages = {tensors[i].untyped_storage().data_ptr(): i for i in open_ints}
    names = {id(t): name for name, t in list(module.named_parameters()) + list(module.named_buffers())}
    found: Dict[int, Tuple[int, str]] = {}

    class _Lookups(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            lookup = _lookup(func, args, kwargs)
            if lookup is not None:
                ids, table, dim = lookup
                index = storages.get(ids.untyped_storage().data_ptr())
                if index is not None and index not in found:
                    found[index] = (int(table.shape[dim]), names.get(id(table), "the tensor"))
            return func(*args, **kwargs)

    try:
        with torch.no_grad(), _Lookups():
            call.call(module)
    except Exception:
        pass
    return found


_EMBEDDINGS = (torch.nn.functional.embedding, torch.nn.functional.embedding_bag)
_INDEX_SELECTS = (torch.index_select, torch.Tensor.index_select)


def _lookup(func: Callable, args: tuple, kwargs: dict) -> Optional[Tuple[torch.Tensor, torch.Tensor, int]]:
    """(ids, table, dim) when ``func`` looks integer ids up along ``dim`` of ``table``."""
    if func in _EMBEDDINGS:
        ids, table, dim = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("weight"), 0
    elif func is torch.Tensor.__getitem__ and len(args) == 2:
        table, index, dim = args[0], args[1], 0
        ids = index[0] if isinstance(index, tuple) and index else index
    elif func in _INDEX_SELECTS and len(args) == 3:
        table, dim, ids = args
    else:
        return None
    if not (isinstance(ids, torch.Tensor) and isinstance(table, torch.Tensor) and isinstance(dim, int)
            and table.dim() > dim and not ids.dtype.is_floating_point and ids.dtype != torch.bool):
        return None
    return ids, table, dim


def _parse_dtype(name: str) -> torch.dtype:
    bare = name.strip().removeprefix("torch.")
    dtype = getattr(torch, bare, None)
    if not isinstance(dtype, torch.dtype):
        raise UserError(
            f"unknown input dtype {name!r}: expected a torch dtype name such as "
            "float32, float16, bfloat16 or int64"
        )
    if dtype not in _INPUT_DTYPES:
        raise UserError(
            f"input dtype {bare} cannot be used for --input or --input-shape inputs (torch has few CPU kernels for it); "
            f"use one of {', '.join(str(d).removeprefix('torch.') for d in _INPUT_DTYPES)}, "
            "or give example_inputs in the model file"
        )
    return dtype


def _parse_dims(text: str, what: str) -> tuple[int, ...]:
    """``1x3x224x224`` or ``1,3,224,224`` (brackets and spaces tolerated) -> (1, 3, 224, 224)."""
    stripped = text.strip().strip("()[]").strip()
    parts = [part.strip() for part in re.split(r"[,x]", stripped)] if stripped else []
    # A trailing comma, as in "(3,)", is fine; an empty part in the middle is not.
    if parts and parts[-1] == "" and len(parts) > 1:
        parts.pop()
    if not parts or not all(re.fullmatch(r"\d+", part) and int(part) > 0 for part in parts):
        raise UserError(f"{what}: the shape {text.strip()!r} must be positive integers joined by x, such as 1x3x224x224")
    dims = tuple(int(part) for part in parts)
    if any(d > _MAX_DIMENSION for d in dims):
        raise UserError(f"{what}: a dimension of {text.strip()!r} is larger than a tensor can be (2**63 - 1)")
    return dims


# The dtypes of generated inputs: those with random numbers and the common kernels on the CPU. Not float8,
# quantized, sub-byte or the wide unsigned types, which only a few operations accept.
_INPUT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.complex64, torch.complex128,
                 torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)


def _validate_shape(shape: Sequence[int] | str, text: Optional[str] = None) -> tuple[int, ...]:
    if isinstance(shape, str):  # "1,3,224,224" straight from a flag or a config file
        return parse_shape(shape)
    shown = repr(text) if text is not None else repr(shape)
    try:
        dims = tuple(shape)
    except TypeError:
        raise UserError(f"bad input shape {shown}: expected a sequence of positive integers") from None
    if not dims or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in dims):
        raise UserError(f"bad input shape {shown}: every dimension must be a positive integer")
    if any(d > _MAX_DIMENSION for d in dims):
        raise UserError(f"bad input shape {shown}: a dimension is larger than a tensor can be (2**63 - 1)")
    return dims


_MAX_DIMENSION = 2 ** 63 - 1


def _check_inputs_fit_in_memory(specs: Sequence["InputSpec"]) -> None:
    """Random inputs larger than this machine's memory are refused before torch tries to allocate them."""
    needed = sum(math.prod(spec.shape) * spec.dtype.itemsize for spec in specs)
    available = _physical_memory()
    if available is not None and needed > available:
        shown = " and ".join("x".join(map(str, spec.shape)) for spec in specs)
        raise UserError(
            f"input shape {shown} needs {_bytes(needed)}, more than this machine's memory "
            f"({_bytes(available)}); use smaller inputs"
        )


def _physical_memory() -> Optional[int]:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not on this platform
        return None


def _bytes(count: int) -> str:
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, unit = float(count), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{count} bytes" if unit == 0 else f"{value:.1f} {units[unit]}"


# --------------------------------------------------------------------------------------------
# Weights


def _load_weights(module: nn.Module, path: str) -> None:
    """Load the weights file at ``path`` (safetensors, or a torch.save state dict) into ``module``,
    memory-mapped; a module built on the meta device takes the file's tensors (checkpoints.py)."""
    label = _display_path(path)
    try:
        checkpoint = read_checkpoint(path)
    except CheckpointError as exc:
        raise UserError(f"{label}: cannot be read as safetensors: {exc}") from None
    except Exception as exc:
        raise UserError(
            f"{label}: cannot be loaded with weights_only=True ({_weights_load_reason(exc)}); "
            "save a plain state dict with torch.save(model.state_dict(), path)"
        ) from None

    state_dict = _state_dict_in(checkpoint)
    if state_dict is None:
        raise UserError(
            f"{label}: holds a {type(checkpoint).__name__}, not a state dict "
            "(or a dict with a 'state_dict' or 'model' entry holding one)"
        )
    state_dict = _strip_data_parallel_prefix(state_dict, module)

    try:
        if meta_tensors(module):
            assign_state_dict(module, state_dict)
        else:
            module.load_state_dict(state_dict, strict=True)
    except Exception as exc:
        # The module is partly loaded now; raising means it never reaches the caller.
        raise UserError(f"{label}: weights do not match the model: {_mismatch(module, state_dict, exc)}") from None
    left = meta_tensors(module)
    if left:
        raise UserError(f"{label}: {_first_few(left)} stay on the meta device: the weights file does not hold them "
                        "(buffers a model computes, not saves); build those on the CPU and only the weights on meta")


def _state_dict_in(checkpoint: Any) -> Optional[dict]:
    if not isinstance(checkpoint, dict):
        return None
    for key in ("state_dict", "model"):  # Lightning and many training scripts nest it
        nested = checkpoint.get(key)
        if isinstance(nested, dict):
            return nested
    if all(isinstance(key, str) for key in checkpoint):
        return checkpoint
    return None


def _strip_data_parallel_prefix(state_dict: dict, module: nn.Module) -> dict:
    """Checkpoints saved from DataParallel/DDP prefix every key with 'module.'; drop it."""
    prefix = "module."
    if all(key.startswith(prefix) for key in state_dict) and not any(
        key.startswith(prefix) for key in module.state_dict()
    ):
        return {key[len(prefix):]: value for key, value in state_dict.items()}
    return state_dict


def _mismatch(module: nn.Module, state_dict: dict, exc: Exception) -> str:
    """One line naming the first few missing, unexpected and misshapen keys."""
    expected = module.state_dict()
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    misshapen = [
        f"{key} {tuple(state_dict[key].shape)} vs {tuple(expected[key].shape)} in the model"
        for key in expected
        if key in state_dict
        and isinstance(state_dict[key], torch.Tensor)
        and isinstance(expected[key], torch.Tensor)
        and state_dict[key].shape != expected[key].shape
    ]
    parts = [
        f"{title} {_first_few(items)}"
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", misshapen))
        if items
    ]
    return "; ".join(parts) if parts else _quote(exc)


def _first_few(items: list[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"{shown}{more}"


def _weights_load_reason(exc: Exception) -> str:
    """The reason in torch's weights_only message, whole: its first sentence after the boilerplate
    (the change of default in 2.6, "Please file an issue", "Check the documentation")."""
    kept = []
    for paragraph in re.split(r"\n\s*\n", str(exc)):
        paragraph = " ".join(paragraph.split())
        if "WeightsUnpickler error:" in paragraph:
            paragraph = paragraph.split("WeightsUnpickler error:", 1)[1].strip()
        elif paragraph.startswith(("Weights only load failed", "Check the documentation")):
            continue
        if paragraph:
            kept.append(paragraph)
    if not kept:
        return _quote(exc)
    sentence = re.match(r"(.+?\.)(?:\s|$)", kept[0])
    return sentence.group(1) if sentence else kept[0]


# --------------------------------------------------------------------------------------------
# No downloads


class _DownloadRefused(Exception):
    """Raised in place of a torch.hub download; its message is the whole explanation."""


@contextlib.contextmanager
def _downloads_refused() -> Iterator[None]:
    """Make torch.hub downloads fail while user code runs.

    preclint never downloads weights, yet some zero-argument factories do by default
    (torchvision's detection models fetch their backbone's ImageNet weights). torch.hub's
    load_state_dict_from_url and hub.load both fetch through this one module-level function.
    Files already in the torch.hub cache still load: that is not a download.
    """

    def refuse(url: str, *args: object, **kwargs: object) -> None:
        raise _DownloadRefused(
            f"it tried to download {url}; preclint never downloads weights: build the model "
            "without pretrained weights (torchvision: weights=None, weights_backbone=None) in a "
            "zero-argument factory, or pass a local checkpoint with --weights"
        )

    original = torch.hub.download_url_to_file
    torch.hub.download_url_to_file = refuse
    try:
        yield
    finally:
        torch.hub.download_url_to_file = original


# --------------------------------------------------------------------------------------------
# Small helpers for messages and locations


def _check_is_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"no such {what}: {path}")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a {what}")
    if not os.path.isfile(path):  # a FIFO or a device (or a link to one): reading it would block or never end
        raise UserError(f"{path}: not a regular file, expected a {what}")


def _display_path(path: str) -> str:
    """Relative to the working directory when inside it, else absolute."""
    from preclint.source.paths import display_path

    return display_path(path, inside_only=True)


def _defining_file(module: nn.Module) -> Optional[str]:
    """The file that defines the model's class, for module targets (torchvision/models/resnet.py)."""
    try:
        found = inspect.getsourcefile(type(module))
    except (TypeError, OSError):
        return None
    return os.path.abspath(found) if found else None


def _located(label: str, abs_path: Optional[str], tb: Optional[TracebackType]) -> str:
    """``label:line`` of the innermost traceback frame in the user's file, else just ``label``."""
    if abs_path is None:
        return label
    line = None
    for frame, lineno in _walk_traceback(tb):
        if os.path.abspath(frame.f_code.co_filename) == abs_path:
            line = lineno
    return f"{label}:{line}" if line is not None else label


def _walk_traceback(tb: Optional[TracebackType]) -> Iterator[tuple[Any, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def _quote(exc: BaseException) -> str:
    """``Type: message`` on one line, shortened; the user's exception as they would recognise it."""
    if isinstance(exc, _DownloadRefused):
        return str(exc)
    message = " ".join(str(exc).split())
    if len(message) > _MAX_QUOTED_CHARS:
        message = message[: _MAX_QUOTED_CHARS - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _a(noun: str) -> str:
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _quoted_list(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)
