"""The format each node computes and stores its result in under a precision mode: from its inputs'
formats, autocast's op lists and regions, explicit casts and, in a cast model, the cast parameters,
buffers and inputs."""
from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional

from preclint.core.ir import Graph, Kind, Node
from preclint.core.numerics import (DTYPE_FORMATS, FORMATS, PROMOTING_BATCHNORMS, Mode, autocast_format, autocast_lowered,
                                    autocast_policy, casting_region)


def widest(formats: Iterable[str]) -> str:
    formats = [f for f in formats if f != "int"]
    if not formats:
        return "int"
    if "fp32" in formats or len(set(formats)) > 1:
        return "fp32"
    return formats[0]



_FX_CONSTANT = re.compile(r"(^|\.)_tensor_constant\d+$")


def fx_tensor_constant(node: Node) -> bool:
    """A tensor the forward creates (``torch.arange(n)`` of a size the trace fixed), which torch.fx
    stores as an attribute of its own (``_tensor_constant0``): not the model's, so ``model.to``
    never casts it; it keeps the dtype the forward gives it. (Not a view of the model's own
    tensor, ``attrs["view_of"]``: that one is cast.)"""
    return (node.fn == "parameter" and bool(node.params) and bool(_FX_CONSTANT.search(node.params[0]))
            and not node.attrs.get("view_of"))


def node_format(node: Node, mode: Mode, input_formats: List[str], dtype_of: Optional[str] = None) -> str:
    """The format the node's result is stored in under ``mode``, from the formats of its inputs and
    the autocast state at the node: the mode's, or the one the model's code set around it
    (``Node.autocast``: ``torch.autocast(enabled=False)``, a region with its own dtype). ``dtype_of``:
    the format of the value whose dtype a cast or a new tensor takes (``attrs["dtype_of"]``)."""
    out = node.out
    if out is not None and not out.is_float:
        return "int"
    # a float made from integers (an embedding lookup, a cast of token ids) takes its format from the
    # float inputs it has, else from the mode
    input_formats = [f for f in input_formats if f != "int"]
    low = autocast_format(node.autocast, mode)
    if mode.low is None and low is None:
        return "fp32"
    if node.kind in (Kind.REDUCTION, Kind.SCAN, Kind.SOFTMAX) and node.attrs.get("dtype") in DTYPE_FORMATS:
        return DTYPE_FORMATS[node.attrs["dtype"]]  # sum(x, dtype=torch.float32) accumulates and returns fp32
    if low is not None and node.kind not in (Kind.INPUT, Kind.CONSTANT):
        policy = autocast_policy(node.fn)
        if policy == "lower":
            return autocast_lowered(node.fn, low).name
        if policy == "fp32":
            return "fp32"
    cast_model = mode.low is not None and not mode.autocast
    if cast_model and (node.kind == Kind.INPUT or node.params and not fx_tensor_constant(node)):
        return mode.low.name  # model.to(dtype): parameters, buffers and inputs are cast
    if node.kind == Kind.INPUT or node.fn == "parameter":
        return "fp32"
    if dtype_of in FORMATS:
        if node.kind == Kind.CAST or (node.kind == Kind.CONSTANT and "dtype" in node.attrs):
            return dtype_of  # made in another value's dtype, which is the mode's where that value is
    if node.kind == Kind.CONSTANT:
        # a tensor the forward creates keeps the dtype it is created with: float32 unless made like
        # another tensor or given a dtype
        if node.fn.endswith("_like") or node.fn.startswith("new_"):
            return input_formats[0] if input_formats else (mode.low.name if cast_model else "fp32")
        return DTYPE_FORMATS.get(node.attrs.get("dtype"), "fp32")
    cast = explicit_cast(node, input_formats)
    if cast is not None:
        return cast
    if node.kind == Kind.ELEMENTWISE and node.attrs.get("float_constant"):
        # it reads a parameter or buffer of at least one dim directly (capture.py), held in float32 under
        # autocast and in the low format in a cast model: type promotion takes the wider
        input_formats = input_formats + [mode.low.name if cast_model else "fp32"]
    # 'promote' and unlisted ops, and every op where autocast is off: the inputs' dtype (type
    # promotion). Parameters enter as fp32 under autocast, so an unlisted op with weights
    # (BatchNorm) keeps its activation input's dtype; in a cast model they hold the low format.
    if not cast_model and node.kind == Kind.BATCHNORM and node.module_type in PROMOTING_BATCHNORMS:
        return "fp32"
    if not cast_model and (node.kind in (Kind.BATCHNORM, Kind.ACTIVATION, Kind.POOL) or node.params):
        return input_formats[0] if input_formats else "fp32"
    return widest(input_formats) if input_formats else (mode.low.name if cast_model else "fp32")


def explicit_cast(node: Node, input_formats: List[str]) -> Optional[str]:
    """The format an explicit cast asks for (.float(), .half(), .to(dtype), .type_as(other))."""
    if node.kind != Kind.CAST:
        return None
    if "dtype" in node.attrs:
        return DTYPE_FORMATS.get(node.attrs["dtype"], "fp32")
    if node.fn in ("half", "bfloat16", "float", "double"):
        return DTYPE_FORMATS[node.fn]
    if node.fn == "type_as" and len(input_formats) > 1:
        return input_formats[1]
    return None


def input_formats(graph: Graph, node: Node, mode: Mode, formats: Dict[str, str]) -> List[str]:
    """The formats the node reads its inputs in: as their producers stored them, except where a
    ``custom_fwd(cast_inputs=...)`` forward casts what comes from outside it (when autocast is on
    around the forward)."""
    region = casting_region(node.autocast, mode)
    if region is None:
        return [formats[n] for n in node.inputs if n in formats]
    cast = DTYPE_FORMATS.get(region.cast_inputs, "fp32")
    return [cast if formats[n] in FORMATS and not region.encloses(graph[n].autocast) else formats[n]
            for n in node.inputs if n in formats]
