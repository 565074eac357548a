"""A mixed-precision plan applied to a model: the modules (and single ops) it keeps in float32.

This module is what a deployed model imports; it needs torch and nothing else from preclint, so
``preclint plan``'s analysis never loads at inference time::

    from preclint.policy import load_policy, apply_policy

    model = apply_policy(model, load_policy("plan.json"))
    with torch.autocast("cuda", dtype=torch.float16):   # autocast modes: the caller's own autocast
        y = model(x)

* autocast modes (``fp16``, ``bf16``): a kept module runs with autocast off and its float16/bfloat16
  inputs cast to float32; its float32 result flows on, and autocast lowers it again where the next
  listed op reads it.
* ``-full`` modes: the model is cast to the low dtype, except the kept modules, whose parameters
  are never cast (they stay float32, not a float32 copy of rounded values) and whose inputs are cast
  up. Their float32 results are cast back where they enter a layer that runs in the low dtype (its
  inputs are cast to its parameters' dtype), and at the model's output: between kept layers values
  stay float32, as at the boundary of a float32 region of an exported FP16 engine. The model's
  inputs are cast to the low dtype on entry.

Three units are not modules (``-full`` modes only; under autocast they are float32 already):

* ``<inputs>``: the model's inputs are not cast down on entry (they reach the first low layer in
  float32 and are rounded there, or not at all where a kept layer reads them);
* ``<outputs>``: the model's outputs are returned as computed, not cast back to the low dtype;
* ``<param:NAME>``: the parameter or buffer NAME (as ``named_parameters``/``named_buffers`` spell
  it) stays float32, for a value the format cannot hold (a variance of 1e-9, a frequency table
  whose rounding moves a large angle); the ops that read it promote to float32 by type promotion.

A kept op (``{"module": "block", "op": "exp"}``) keeps every call of that op in the module's own
forward in float32 (a torch function mode sees them), not the rest of the module.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import torch

LOW_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
PRECISIONS = ("fp16", "bf16", "fp16-full", "bf16-full")
INPUTS = "<inputs>"
OUTPUTS = "<outputs>"
MAX_SIZE = 64 << 20  # a plan file larger than this is no plan preclint wrote
PARAM = "<param:"  # "<param:layer1.0.bn1.running_var>"


def param_name(module: str) -> Optional[str]:
    """NAME of a ``<param:NAME>`` unit, else None."""
    return module[len(PARAM):-1] if module.startswith(PARAM) and module.endswith(">") else None


def is_module(name: str) -> bool:
    """Whether a kept entry names a module (not ``<inputs>``, ``<outputs>`` or a parameter)."""
    return not name.startswith("<")


class PolicyError(ValueError):
    """A policy that does not fit the model or cannot be read."""


@dataclass(frozen=True)
class Kept:
    module: str  # qualified module name ("" is the whole model)
    op: Optional[str] = None  # a canonical op name ("exp", "softmax", "mul"); None: the whole module


@dataclass
class Policy:
    precision: str
    keep: List[Kept] = field(default_factory=list)

    @property
    def full(self) -> bool:
        return self.precision.endswith("-full")

    @property
    def low_dtype(self) -> torch.dtype:
        return LOW_DTYPES[self.precision.split("-")[0]]


def load_policy(source: Union[str, os.PathLike, Dict[str, Any], Policy]) -> Policy:
    """A policy from a plan file written by ``preclint plan --output-format json`` (or its dict)."""
    if isinstance(source, Policy):
        return source
    if isinstance(source, dict):
        data = source
    else:
        from preclint.text.safe_io import load_json  # lazy: a deployed model imports the policy alone

        try:  # a regular file of a bounded size: a FIFO or a link to /dev/zero is refused at once
            data = load_json(os.fspath(source), MAX_SIZE)
        except OSError as exc:
            raise PolicyError(f"cannot read the policy {os.fspath(source)}: {exc.strerror or exc}") from None
        except ValueError as exc:
            raise PolicyError(f"{os.fspath(source)} is not a JSON plan: {exc}") from None
    if not isinstance(data, dict):
        raise PolicyError("a policy is a JSON object with 'precision' and 'keep'")
    precision = data.get("precision")
    if precision not in PRECISIONS:
        raise PolicyError(f"the policy's precision is {precision!r}; expected one of {', '.join(PRECISIONS)}")
    keep = data.get("keep", [])
    if not isinstance(keep, list):
        raise PolicyError("the policy's 'keep' is a list of {\"module\", \"op\"} entries")
    kept = []
    for entry in keep:
        if isinstance(entry, str):
            entry = {"module": entry}
        if not isinstance(entry, dict) or not isinstance(entry.get("module"), str):
            raise PolicyError(f"a kept entry names its module: {entry!r}")
        op = entry.get("op")
        if op is not None and not isinstance(op, str):
            raise PolicyError(f"a kept entry's op is a name or null: {entry!r}")
        kept.append(Kept(entry["module"], op))
    return Policy(precision, kept)


def apply_policy(model: torch.nn.Module, policy: Union[Policy, Dict[str, Any], str, os.PathLike]) -> torch.nn.Module:
    """``model`` with the policy's modules and ops kept in float32 (changed in place, like
    ``Module.to``, and returned). Raises PolicyError when the policy names a module or a parameter
    the model lacks."""
    policy = load_policy(policy)
    modules = dict(model.named_modules(remove_duplicate=False))  # a shared module under each of its names
    tensors = {**dict(model.named_parameters(remove_duplicate=False)), **dict(model.named_buffers(remove_duplicate=False))}
    unknown = sorted({k.module for k in policy.keep if is_module(k.module) and k.module not in modules
                      or param_name(k.module) is not None and param_name(k.module) not in tensors
                      or not is_module(k.module) and param_name(k.module) is None
                      and k.module not in (INPUTS, OUTPUTS)})
    if unknown:
        shown = ", ".join(repr(u) for u in unknown[:5]) + (f" and {len(unknown) - 5} more" if len(unknown) > 5 else "")
        raise PolicyError(f"the policy keeps modules or parameters this model does not have: {shown}")
    special = {k.module for k in policy.keep if not is_module(k.module)}
    whole = [k.module for k in policy.keep if k.op is None and is_module(k.module)]
    # a module inside a kept one is kept by it
    whole = [m for m in dict.fromkeys(whole) if not any(_inside(m, o) for o in whole if o != m)]
    ops: Dict[str, List[str]] = {}
    for k in policy.keep:
        if k.op is not None and is_module(k.module) and not any(_inside(k.module, o) or k.module == o for o in whole):
            ops.setdefault(k.module, []).append(k.op)
    low = policy.low_dtype if policy.full else None
    if low is not None:
        kept_params = {param_name(m) for m in special} - {None}
        for path, module in modules.items():
            if any(path == o or _inside(path, o) for o in whole):
                continue  # a kept module's parameters are never rounded: they stay as they are
            _cast_own(module, path, low, kept_params)
            if _holds_low(module, low) and not (path == "" and INPUTS in special):
                module.register_forward_pre_hook(_CastInputs(low), with_kwargs=True)
        # the inputs enter in the low dtype, as the cast model's caller feeds them, unless kept
        model.register_forward_pre_hook(_CastInputs(low) if INPUTS not in special else _CastUp(), with_kwargs=True)
        if OUTPUTS not in special:
            model.register_forward_hook(_CastOutputs(low))
    for path in whole:
        _wrap(modules[path], _Float32Forward(modules[path].forward, None))
    for path, names in ops.items():
        _wrap(modules[path], _Float32Forward(modules[path].forward, tuple(dict.fromkeys(names))))
    return model


def _cast_own(module: torch.nn.Module, path: str, low: torch.dtype, kept: set) -> None:
    """A module's own floating parameters and buffers to ``low``, but those the policy keeps."""
    prefix = path + "." if path else ""
    for name, param in module._parameters.items():
        if param is not None and param.is_floating_point() and prefix + name not in kept:
            param.data = param.data.to(low)
    for name, buffer in list(module._buffers.items()):
        if buffer is not None and buffer.is_floating_point() and prefix + name not in kept:
            module._buffers[name] = buffer.to(low)


def _holds_low(module: torch.nn.Module, low: torch.dtype) -> bool:
    own = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
    return any(t.dtype == low for t in own)


class _CastInputs:
    """A layer of the cast model reads float32 values (from a kept layer) in its own dtype."""

    def __init__(self, low: torch.dtype) -> None:
        self.low = low

    def __call__(self, module, args, kwargs):
        down = lambda t: t.to(self.low) if t.dtype == torch.float32 else t  # noqa: E731
        return _float_tensors(args, down), _float_tensors(kwargs, down)


class _CastUp:
    """The model's float inputs in float32 (``<inputs>`` kept): whatever dtype the caller fed."""

    def __call__(self, module, args, kwargs):
        return _float_tensors(args, _up), _float_tensors(kwargs, _up)


class _CastOutputs:
    """The cast model's outputs in its dtype, whatever the last layer ran in."""

    def __init__(self, low: torch.dtype) -> None:
        self.low = low

    def __call__(self, module, args, output):
        return _float_tensors(output, lambda t: t.to(self.low) if t.dtype == torch.float32 else t)


def _inside(path: str, outer: str) -> bool:
    return outer == "" or path.startswith(outer + ".")


def _wrap(module: torch.nn.Module, forward: "_Float32Forward") -> None:
    # an instance attribute: nn.Module.__call__ finds it first; copies and pickles of the model keep it
    module.forward = forward


def _float_tensors(value, fn):
    if isinstance(value, torch.Tensor):
        return fn(value) if value.is_floating_point() else value
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
        return type(value)(*(_float_tensors(v, fn) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_float_tensors(v, fn) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _float_tensors(v, fn)) for k, v in value.items())
    return value


def _device_types(value) -> Tuple[str, ...]:
    types = {"cpu"}
    _float_tensors(value, lambda t: types.add(t.device.type) or t)
    return tuple(sorted(types))


def _up(t: torch.Tensor) -> torch.Tensor:
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _AutocastOff:
    def __init__(self, device_types: Sequence[str]) -> None:
        self.contexts = [torch.autocast(d, enabled=False) for d in device_types]

    def __enter__(self):
        for c in self.contexts:
            c.__enter__()

    def __exit__(self, *exc):
        for c in reversed(self.contexts):
            c.__exit__(*exc)
        return False


def _run_float32(fn, args, kwargs):
    """``fn`` with autocast off and float32 operands."""
    with _AutocastOff(_device_types((args, kwargs))):
        return fn(*_float_tensors(args, _up), **_float_tensors(kwargs, _up))


class _Float32Forward:
    """A module's forward in float32 (``ops`` None), or with only the named ops in float32."""

    def __init__(self, forward, ops: Optional[Tuple[str, ...]]) -> None:
        self.forward = forward
        self.ops = ops

    def __call__(self, *args, **kwargs):
        if self.ops is None:
            return _run_float32(self.forward, args, kwargs)
        with _KeptOps(self.ops):
            return self.forward(*args, **kwargs)


class _KeptOps(torch.overrides.TorchFunctionMode):
    """Runs the calls of the named ops in float32 while the module's forward runs."""

    def __init__(self, ops: Sequence[str]) -> None:
        super().__init__()
        self.names = frozenset(n for op in ops for n in _spellings(op))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in self.names:
            return _run_float32(func, args, kwargs)
        return func(*args, **kwargs)


# ------------------------------------------------------------------------------------------ ONNX


def onnx_patterns(keep: Sequence[Kept]) -> List[str]:
    """Regular expressions over the scope path of an exported ONNX node, for ``nodes_to_exclude``
    style lists. torch.onnx's TorchScript exporter names an op of ``layer1.0.conv1``
    ``/layer1/layer1.0/conv1/Conv``; the dynamo exporter (torch >= 2.9's default) records the
    scopes as metadata, ``/layer1/layer1.0/layer1.0.conv1/conv2d_1`` (``onnx_nodes_to_exclude``
    reads it): each level is matched in either spelling."""
    import re

    patterns = []
    for k in keep:
        if not is_module(k.module):
            continue  # inputs, outputs and parameters are no node of their own: keep_io_types, initializers
        parts = k.module.split(".") if k.module else []
        scopes = "".join("/" + _either(re.escape(".".join(parts[:i + 1])), re.escape(p)) for i, p in enumerate(parts))
        if k.op is None:
            patterns.append(f"^{scopes}/.+$")
        else:
            names = "|".join(dict.fromkeys(re.escape(n) for n in (k.op,) + _ALIASES.get(k.op, ()) + _ONNX_OPS.get(k.op, ())))
            patterns.append(f"^{scopes}/(?i:{names})(?:_\\d+)?$")
    return patterns


def onnx_nodes_to_exclude(onnx_model, policy) -> List[str]:
    """Names of the nodes of an exported ONNX model (an onnx ModelProto) that the policy keeps in
    float32: what onnxconverter-common's ``node_block_list`` and ORT's ``nodes_to_exclude`` take."""
    import re

    policy = load_policy(policy)
    compiled = [re.compile(p) for p in onnx_patterns(policy.keep)]
    names = []
    for node in onnx_model.graph.node:
        scopes = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes"), None)
        path = node.name
        if scopes is not None:
            try:
                path = "/".join(json.loads(scopes.replace("'", '"')))
            except ValueError:
                pass
        if any(c.match(path) for c in compiled):
            names.append(node.name)
    return names


def _either(a: str, b: str) -> str:
    return a if a == b else f"(?:{a}|{b})"


_ONNX_OPS = {"add": ("Add",), "sub": ("Sub",), "mul": ("Mul",), "div": ("Div",), "exp": ("Exp",), "log": ("Log",),
             "pow": ("Pow",), "sqrt": ("Sqrt",), "rsqrt": ("Rsqrt", "Sqrt", "Reciprocal"), "softmax": ("Softmax",),
             "log_softmax": ("LogSoftmax",), "matmul": ("MatMul",), "sum": ("ReduceSum",), "mean": ("ReduceMean",),
             "reciprocal": ("Reciprocal",), "cumsum": ("CumSum",)}


_ALIASES = {"div": ("truediv",), "truediv": ("div",), "sub": ("rsub",), "pow": ("rpow",)}


def _spellings(op: str) -> Tuple[str, ...]:
    """The names torch calls an op by: torch.exp, Tensor.exp, Tensor.exp_, x * y (Tensor.__mul__) ..."""
    names = []
    for base in (op,) + _ALIASES.get(op, ()):
        names += [base, base + "_", f"__{base}__", f"__r{base}__", f"__i{base}__"]
    return tuple(names)


__all__ = ["INPUTS", "OUTPUTS", "Kept", "is_module", "param_name", "Policy", "PolicyError", "apply_policy", "load_policy", "onnx_nodes_to_exclude", "onnx_patterns"]
