"""Reading ``--input`` and ``--input-shape``: the inputs to draw (name, shape, dtype, values), checked
before any user code runs, down to whether they fit in this machine's memory."""

from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from preclint.core.errors import UserError
from preclint.load.available_memory import format_bytes
from preclint.load.messages import quoted_list


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
    dtype = parse_dtype(parts[1]) if len(parts) > 1 and parts[1].strip() else default_dtype
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


def check_unique_names(specs: Sequence[InputSpec]) -> None:
    names = [spec.name for spec in specs if spec.name is not None]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise UserError(f"--input names {quoted_list(repeated)} more than once; give each input once")


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse ``"1,3,224,224"`` or ``"1x3x224x224"`` into ``(1, 3, 224, 224)``."""
    return _parse_dims(text, f"bad input shape {text!r}")


def parse_dtype(name: str) -> torch.dtype:
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


def validate_shape(shape: Sequence[int] | str, text: Optional[str] = None) -> tuple[int, ...]:
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


def check_inputs_fit_in_memory(specs: Sequence["InputSpec"]) -> None:
    """Random inputs larger than this machine's memory are refused before torch tries to allocate them."""
    needed = sum(math.prod(spec.shape) * spec.dtype.itemsize for spec in specs)
    available = physical_memory()
    if available is not None and needed > available:
        shown = " and ".join("x".join(map(str, spec.shape)) for spec in specs)
        raise UserError(
            f"input shape {shown} needs {format_bytes(needed)}, more than this machine's memory "
            f"({format_bytes(available)}); use smaller inputs"
        )


def physical_memory() -> Optional[int]:
    """This machine's memory in bytes; None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):  # not on this platform
        return None
