"""What a compiled backend made of a model, read back: the graph it lowered and the kernels it fused.

Inductor lowers each graph Dynamo captures to a post-grad FX graph (ATen and prims ops, functional,
each node's value a fake tensor with its dtype, each node's ``stack_trace`` and ``nn_module_stack``
from the user's code) and then generates code for it, one kernel per group of fused nodes; the
wrapper names each kernel's source nodes in a comment (``# Topologically Sorted Source Nodes: [y,
z], Original ATen: [aten.mul, aten.tanh]``). Both are read here into plain records:

* ``CompiledNode``: one op of the post-grad graph, with its dtype, the user's frames that made it and
  the module that owns it, and its role (a cast, a view, a product, a reduction, a pointwise op);
* ``Kernel``: one fused kernel of the generated code and the source nodes it fuses;
* ``elided_roundings``: the reduced-precision values a fused kernel keeps in float32. Eager rounds
  every op's result to bfloat16/float16; Inductor fuses chains of pointwise ops (and the reductions
  they feed) into one kernel and drops the downcast-upcast pair between them
  (``torch._inductor.config.emulate_precision_casts`` keeps it). A value whose users are all fused
  ops is one whose rounding the kernel removes; where Inductor still stores it to a buffer (a value
  read by many kernels) its rounding stays, so the list is what compilation may remove, and the
  measured gap with and without ``emulate_precision_casts`` says what it did remove.

The precision checks on a compiled graph (``kept_float32_lost``, ``foreign_dtypes``) read these
records; the compiled backends (measure/compilers/) capture them.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

REDUCED = ("bfloat16", "float16")

# ATen/prims ops by what they compute, after Inductor's decompositions (their overload dropped).
_CASTS = {"convert_element_type", "_to_copy", "to"}
_VIEWS = {
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "squeeze", "unsqueeze",
    "slice", "select", "as_strided", "alias", "clone", "contiguous", "split", "split_with_sizes", "cat",
    "unbind", "getitem", "detach", "copy", "copy_", "full", "empty", "iota", "arange", "zeros", "ones",
    "empty_strided", "full_like", "zeros_like", "ones_like", "index", "gather", "embedding", "constant_pad_nd",
    "slice_scatter", "select_scatter", "where", "masked_fill", "scalar_tensor",
}
_PRODUCTS = {
    "mm", "addmm", "bmm", "baddbmm", "convolution", "_scaled_mm", "_int_mm", "addmv", "mv",
    "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_cudnn_attention",
    "_flash_attention_forward", "_efficient_attention_forward", "mkldnn_rnn_layer",
}
_REDUCTIONS = {
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "var_mean", "std", "logsumexp",
    "argmax", "argmin", "cumsum", "cumprod", "native_layer_norm", "native_group_norm", "_softmax",
    "_log_softmax", "native_batch_norm", "_native_batch_norm_legit_no_training", "any", "all", "norm",
    "linalg_vector_norm",
}

_USER_CASTS = frozenset({"to", "float", "half", "bfloat16", "double", "type", "type_as"})

# The check's canonical op names (capture/ops.py) and the ATen ops they lower to, where the names part.
_LOWERED_TO = {
    "linear": ("addmm", "mm", "bmm", "linear"), "matmul": ("mm", "bmm", "matmul", "addmm"),
    "conv1d": ("convolution",), "conv2d": ("convolution",), "conv3d": ("convolution",),
    "softmax": ("_softmax", "softmax", "amax", "exp", "sum", "div", "sub"),
    "log_softmax": ("_log_softmax", "log_softmax", "amax", "exp", "log", "sum", "sub"),
    "layer_norm": ("native_layer_norm", "var_mean", "rsqrt", "sub", "mul", "add"),
    "group_norm": ("native_group_norm", "var_mean", "rsqrt", "sub", "mul", "add"),
    "batch_norm": ("native_batch_norm", "_native_batch_norm_legit_no_training", "sub", "mul", "add", "rsqrt"),
    "rms_norm": ("mean", "pow", "rsqrt", "mul", "add"),
    "scaled_dot_product_attention": tuple(sorted(_PRODUCTS)) + ("_softmax", "bmm"),
    "gelu": ("gelu", "erf", "mul", "add", "tanh"), "silu": ("silu", "sigmoid", "mul"),
    "pow": ("pow", "mul"), "square": ("pow", "mul"), "truediv": ("div",), "div": ("div",),
    "add": ("add",), "sub": ("sub",), "mul": ("mul",), "mean": ("mean", "sum", "div"),
}


@dataclass(frozen=True)
class CompiledNode:
    """One op of a post-grad graph."""

    name: str
    op: str  # the ATen/prims op without namespace and overload: "mul", "convert_element_type"
    original: str  # the op the user's code called, as Inductor records it ("_softmax" for a softmax's exp)
    role: str  # "cast", "view", "product", "reduction", "pointwise", "input", "output"
    dtype: Optional[str]  # of its value: "bfloat16", "float32", ...; None where it has no tensor value
    input_dtype: Optional[str] = None  # a cast's: the dtype it converts from
    frames: Tuple[Tuple[str, int], ...] = ()  # the user's (file, line), innermost first
    module: str = ""  # the module that owns it ("layers.0.attn"), as the compiled root's child
    inputs: Tuple[str, ...] = ()
    users: Tuple[str, ...] = ()
    source_fn: str = ""  # the call of the user's code Dynamo traced it from: "to", "float", "Linear", "softmax"

    @property
    def user_cast(self) -> bool:
        """A cast the model's code wrote (``.to(dtype)``, ``.float()``), not one autocast inserted
        into an op (those are traced from the op: a Linear, a matmul)."""
        return self.role == "cast" and self.source_fn in _USER_CASTS

    @property
    def computes(self) -> bool:
        return self.role in ("product", "reduction", "pointwise")

    @property
    def where(self) -> Optional[Tuple[str, int]]:
        return self.frames[0] if self.frames else None

    def made_at(self, path: str, line: int) -> bool:
        """Whether the user's line ``path:line`` is among the frames that made this op."""
        path = os.path.abspath(path)
        return any(p == path and ln == line for p, ln in self.frames)


@dataclass(frozen=True)
class Kernel:
    """One kernel of the generated code: its name and the pre-grad source nodes it computes."""

    name: str  # "cpp_fused__softmax_add_mul_1", "triton_poi_fused_add_mul_0"
    sources: Tuple[str, ...]
    aten: Tuple[str, ...]

    @property
    def fused(self) -> bool:
        return "fused" in self.name


@dataclass
class CompiledGraph:
    """The post-grad graphs of one compilation (one per graph Dynamo captured) and its kernels."""

    nodes: List[CompiledNode] = field(default_factory=list)
    kernels: List[Kernel] = field(default_factory=list)
    graphs: int = 0

    def by_name(self) -> Dict[str, CompiledNode]:
        return {n.name: n for n in self.nodes}


# ------------------------------------------------------------------ reading torch's records


def module_path(dynamo_path: str) -> str:
    """``L['self'].layers[0].attn`` (or its ``._modules['layers']`` / ``getattr`` spellings), as
    Dynamo's ``nn_module_stack`` names a module, in ``named_modules`` spelling: ``layers.0.attn``."""
    path = dynamo_path
    while True:
        unwrapped = re.sub(r"getattr\(([^(),]+),\s*'([^']+)'\)", r"\1.\2", path)
        if unwrapped == path:
            break
        path = unwrapped
    path = re.sub(r"^L\['[^']+'\]", "", path)
    path = re.sub(r"\._modules\['([^']+)'\]", r".\1", path)
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"\['([^']+)'\]", r".\1", path)
    return path.strip(".")


def _op_name(target) -> str:
    name = getattr(target, "__name__", None) or str(target)
    # "aten.mul.Tensor", "prims.convert_element_type.default", "mul.Tensor"
    parts = str(getattr(target, "_name", name)).replace("::", ".").split(".")
    parts = [p for p in parts if p not in ("aten", "prims", "default", "Tensor", "Scalar", "self", "dim",
                                           "dim_IntList", "correction", "int", "float", "Tensor_Scalar",
                                           "Tensor_Tensor", "Scalar_Tensor", "out", "inductor")]
    return parts[0] if parts else str(target)


def _role(op: str) -> str:
    if op in _CASTS:
        return "cast"
    if op in _VIEWS:
        return "view"
    if op in _PRODUCTS:
        return "product"
    if op in _REDUCTIONS:
        return "reduction"
    return "pointwise"


def _dtype(value) -> Optional[str]:
    dtype = getattr(value, "dtype", None)
    if dtype is None and isinstance(value, (tuple, list)) and value:
        dtype = getattr(value[0], "dtype", None)
    return str(dtype).replace("torch.", "") if dtype is not None else None


def read_post_grad(graph, prefix: str = "") -> List[CompiledNode]:
    """The nodes of a post-grad ``torch.fx.Graph``; ``prefix``: the path of the compiled module
    (a block compiled alone), which its nodes' module paths are relative to."""
    nodes = []
    for node in graph.nodes:
        if node.op == "placeholder":
            role, op = "input", "input"
        elif node.op == "output":
            role, op = "output", "output"
        elif node.op == "call_function":
            op = _op_name(node.target)
            role = _role(op)
        else:
            continue
        meta = node.meta
        frames = _frames(meta.get("stack_trace"))
        stack = meta.get("nn_module_stack") or {}
        owner = module_path(list(stack.values())[-1][0]) if stack else ""
        owner = ".".join(p for p in (prefix, owner) if p)
        original = meta.get("original_aten")
        inputs = tuple(a.name for a in node.all_input_nodes)
        input_dtype = None
        if role == "cast" and node.all_input_nodes:
            input_dtype = _dtype(node.all_input_nodes[0].meta.get("val"))
        source = (meta.get("source_fn_stack") or [("", "")])[-1][1]
        source = source if isinstance(source, str) else getattr(source, "__name__", str(source))
        nodes.append(CompiledNode(node.name, op, _op_name(original) if original is not None else op, role,
                                  _dtype(meta.get("val")), input_dtype, frames, owner, inputs,
                                  tuple(u.name for u in node.users), source))
    return nodes


_FRAME_RE = re.compile(r'File "(.+?)", line (\d+)')
_TORCH_DIR: Optional[str] = None


def _frames(stack_trace: Optional[str]) -> Tuple[Tuple[str, int], ...]:
    """The frames of a node's stack trace (Dynamo's: the compiled code's frames only), innermost
    first, less torch's own and generated code."""
    global _TORCH_DIR
    if not stack_trace:
        return ()
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    frames = [(os.path.abspath(path), int(line)) for path, line in _FRAME_RE.findall(stack_trace)
              if not path.startswith("<")]
    return tuple(f for f in reversed(frames) if not f[0].startswith(_TORCH_DIR))


_SOURCES_RE = re.compile(r"#\s*Topologically Sorted Source Nodes:\s*\[(.*?)\](?:,\s*Original ATen:\s*\[(.*?)\])?")
_KERNEL_RE = re.compile(r"^\s*((?:cpp|triton)_\w+|extern_kernels\.\w+)(?:\.run)?\(")
_OTHER_CALL_RE = re.compile(r"^\s*[A-Za-z_][\w.]*\(")


def read_kernels(code: str) -> List[Kernel]:
    """The kernels the generated wrapper code calls (Inductor's C++ and Triton kernels, and the
    library products it calls out to), each with the source nodes of the comment before its call
    where there is one (the C++ wrapper comments only some: a kernel's name lists its ATen ops)."""
    kernels = []
    pending: Optional[Tuple[Tuple[str, ...], Tuple[str, ...]]] = None
    split = lambda text: tuple(s.strip() for s in (text or "").split(",") if s.strip())  # noqa: E731
    for line in code.splitlines():
        found = _SOURCES_RE.search(line)
        if found:
            pending = (split(found.group(1)), split(found.group(2)))
            continue
        call = _KERNEL_RE.match(line)
        if call:
            kernels.append(Kernel(call.group(1), *(pending or ((), ()))))
            pending = None
        elif _OTHER_CALL_RE.match(line):
            pending = None  # the comment was another call's
    return kernels


# ------------------------------------------------------------------ what the graph computes


def elided_roundings(nodes: Sequence[CompiledNode]) -> List[CompiledNode]:
    """The reduced-precision values that only fused ops read: a fused kernel keeps them in float32
    where eager rounds each (unless ``emulate_precision_casts``)."""
    named = {n.name: n for n in nodes}
    fusable = ("pointwise", "reduction", "cast", "view")
    found = []
    for n in nodes:
        if n.dtype not in REDUCED or n.role not in ("pointwise", "reduction", "cast"):
            continue
        if n.role == "cast" and (n.input_dtype is None or n.input_dtype == n.dtype):
            continue  # a cast rounds only from another dtype (float32, or the other reduced format)
        users = [named.get(u) for u in n.users]
        if users and all(u is not None and u.role in fusable for u in users) \
                and any(u.role in ("pointwise", "reduction", "cast") for u in users):
            found.append(n)
    return found


def computed_dtypes(nodes: Iterable[CompiledNode]) -> Dict[str, int]:
    """How many computing ops (products, reductions, pointwise) produce each floating dtype."""
    counts: Dict[str, int] = {}
    for n in nodes:
        if n.computes and n.dtype is not None and n.dtype.startswith(("float", "bfloat")):
            counts[n.dtype] = counts.get(n.dtype, 0) + 1
    return counts


def foreign_dtypes(compiled: Dict[str, int], eager: Iterable[str]) -> List[str]:
    """The reduced formats the compiled graph computes in that the eager run of the same mode never
    produced: a graph compiled for another precision (a stale cache entry) runs in them."""
    eager = set(eager)
    return sorted(d for d in compiled if d in REDUCED and d not in eager)


@dataclass(frozen=True)
class KeptSite:
    """A place where the model (or a plan) keeps values in float32: what it is, the user's line that
    says so, and the ops (file, line, canonical op) that must compute in float32 there."""

    what: str  # "autocast(enabled=False) region", ".float() call", "the plan's kept module 'n'"
    path: str
    line: int
    ops: Tuple[Tuple[str, int, str], ...]
    node: str = ""  # the check's node the site is reported at (its first op, or the cast itself)
    module: Optional[str] = None  # a kept module: its ops in the compiled graph, by the module that owns them


def site_nodes(nodes: Sequence[CompiledNode], site: KeptSite) -> List[CompiledNode]:
    """The computing ops of the compiled graph that the site's ops lowered to."""
    found = []
    for n in nodes:
        if not n.computes:
            continue
        if site.module is not None and n.module and (not site.module or n.module == site.module
                                                     or n.module.startswith(site.module + ".")):
            found.append(n)
            continue
        for path, line, fn in site.ops:
            if n.made_at(path, line) and _lowered_from(n, fn):
                found.append(n)
                break
    return found


def _lowered_from(node: CompiledNode, fn: str) -> bool:
    names = _LOWERED_TO.get(fn, (fn,))
    return node.original.lstrip("_") in {n.lstrip("_") for n in names} or node.op.lstrip("_") in {
        n.lstrip("_") for n in names}


def kept_float32_lost(nodes: Sequence[CompiledNode], site: KeptSite) -> Tuple[List[CompiledNode], int]:
    """(the site's ops that compute in a reduced format in the compiled graph, how many of its ops
    the compiled graph holds): a kept region holds when the first is empty."""
    mine = site_nodes(nodes, site)
    return [n for n in mine if n.dtype in REDUCED], len(mine)


def float_calls(nodes: Sequence[CompiledNode]) -> List[Tuple[CompiledNode, List[CompiledNode], int]]:
    """Each ``.float()`` (or ``.to(torch.float32)``) the code calls on a reduced-precision value in
    the compiled graph: (the cast, the ops reading it that compute in a reduced format, how many
    computing ops read it), views followed."""
    named = {n.name: n for n in nodes}
    found = []
    for cast in nodes:
        if not (cast.user_cast and cast.dtype == "float32" and cast.input_dtype in REDUCED):
            continue
        readers, seen, todo = [], set(), list(cast.users)
        while todo:
            user = named.get(todo.pop())
            if user is None or user.name in seen:
                continue
            seen.add(user.name)
            if user.role == "view":
                todo.extend(user.users)
            elif user.computes:
                readers.append(user)
        found.append((cast, [r for r in readers if r.dtype in REDUCED], len(readers)))
    return found


def reduced_user_casts(nodes: Sequence[CompiledNode]) -> List[Tuple[CompiledNode, bool]]:
    """Each cast of the code to bfloat16/float16 from another float dtype: (the cast, whether a
    fused kernel removes its rounding)."""
    elided = {n.name for n in elided_roundings(nodes)}
    return [(n, n.name in elided) for n in nodes
            if n.user_cast and n.dtype in REDUCED and n.input_dtype not in (None, n.dtype)
            and n.input_dtype.startswith(("float", "bfloat"))]
