"""What an op's call says about it, read the same way on both capture paths: its display name, its
attributes (dim, stride, dtype...), its scalar arguments, the parameters a module reads, whether it
writes in place, and the reduction length of the shapes it got."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from preclint.capture import ops
from preclint.core.ir import Kind, Node


def display_target(target: Any, call: str) -> str:
    """How a report names the callee: ``F.conv2d``, ``Tensor.add``, ``torch.matmul``, ``operator.add``."""
    if call == "call_method":
        return f"Tensor.{target}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", str(target))
    if module.startswith("torch._ops") and getattr(target, "_opname", None):  # torch.ops.aten.conv2d.default
        return f"aten.{target._opname}"
    if module.startswith("torch.nn.functional"):
        return f"F.{name}"
    if module in ("_operator", "operator"):
        return f"operator.{name}"
    if module.startswith("torchvision"):
        return f"torchvision.ops.{name}"
    if module.startswith("torch") or module == "" or "torch._C" in module:
        return f"torch.{name}"
    return f"{module}.{name}"


def scalar_args(args, kwargs, skip_first: bool) -> Dict[str, float]:
    """The call's int and float arguments (not bools), by position (``arg1``) or keyword."""
    scalars = {}
    for i, value in enumerate(args):
        if i == 0 and skip_first:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[f"arg{i}"] = float(value)
    for key, value in kwargs.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            scalars[key] = float(value)
    return scalars


def call_attrs(fn: str, kind: str, args, kwargs) -> Dict[str, Any]:
    """The attributes of a function call the rules read: dim, k, groups, stride, padding, dilation,
    inplace, dtype."""
    attrs: Dict[str, Any] = {}
    dim = kwargs.get("dim", kwargs.get("axis"))
    if dim is None and kind in (Kind.REDUCTION, Kind.SCAN, Kind.SOFTMAX, Kind.DECISION) and len(args) > 1:
        candidate = args[1]
        if isinstance(candidate, int) or (isinstance(candidate, (tuple, list)) and all(isinstance(d, int) for d in candidate)):
            dim = candidate
    if isinstance(dim, (int, tuple, list)):
        attrs["dim"] = tuple(dim) if isinstance(dim, list) else dim
    if kind == Kind.DECISION and fn == "topk":
        k = kwargs.get("k", args[1] if len(args) > 1 else None)
        if isinstance(k, int):
            attrs["k"] = k
        attrs.pop("dim", None)
        d = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        if isinstance(d, int):
            attrs["dim"] = d
    if kind == Kind.CONV:
        groups = kwargs.get("groups", args[6] if len(args) > 6 else None)
        if isinstance(groups, int):
            attrs["groups"] = groups
    for position, key in ((3, "stride"), (4, "padding"), (5, "dilation")):
        value = kwargs.get(key, args[position] if kind == Kind.CONV and len(args) > position else None)
        if isinstance(value, int):
            value = (value,)
        if isinstance(value, (tuple, list)) and all(isinstance(v, int) for v in value):
            attrs[key] = tuple(value)
    if kwargs.get("inplace"):
        attrs["inplace"] = True
    for key in ("dtype",):
        if key in kwargs and isinstance(kwargs[key], torch.dtype):
            attrs["dtype"] = str(kwargs[key]).replace("torch.", "")
    for value in args:
        if isinstance(value, torch.dtype):
            attrs["dtype"] = str(value).replace("torch.", "")
    return attrs


_INPLACE_DUNDERS = frozenset({"__setitem__", "setitem", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                              "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
                              "__ilshift__", "__irshift__", "iadd", "isub", "imul", "itruediv"})


def is_inplace_call(callee, kwargs) -> bool:
    """Whether this call writes into its first argument (a module with inplace=True, add_, setitem)."""
    if kwargs.get("inplace") is True:
        return True
    if isinstance(callee, torch.nn.Module):
        return getattr(callee, "inplace", None) is True
    name = callee if isinstance(callee, str) else getattr(callee, "__name__", "")
    return name in _INPLACE_DUNDERS or (name.endswith("_") and not name.startswith("_"))


def direct_params(module: torch.nn.Module, path: str) -> Tuple[str, ...]:
    """The qualified names of the parameters and buffers ``module`` (at ``path``) holds itself."""
    names = [n for n, _ in module.named_parameters(recurse=False)] + [n for n, _ in module.named_buffers(recurse=False)]
    prefix = f"{path}." if path else ""
    return tuple(prefix + n for n in names)


def _shape(value) -> Optional[Tuple[int, ...]]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else None


def set_reduction_length(node: Node, args, kwargs, callee) -> None:
    """K of a dot product or N of a reduction, from the shapes the op really got."""
    in_shapes = [_shape(a) for a in args if isinstance(a, torch.Tensor)]
    if isinstance(callee, torch.nn.Module):
        weight = getattr(callee, "weight", None)
        if isinstance(weight, torch.Tensor):
            in_shapes = in_shapes[:1] + [tuple(weight.shape)]
    if node.kind == Kind.CONV and "kernel_size" not in node.attrs and len(in_shapes) >= 2 and in_shapes[1]:
        # a functional conv: its geometry is in the weight's shape (out, in/groups, *kernel)
        weight = in_shapes[1]
        node.attrs["kernel_size"] = tuple(weight[2:])
        node.attrs["in_channels"] = weight[1] * (node.groups or 1)
        node.attrs["out_channels"] = weight[0]
    node.reduction_length = ops.reduction_length(node.kind, node.fn, node.attrs, in_shapes, None)
