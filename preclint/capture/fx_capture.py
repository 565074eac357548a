"""The FX capture path: torch.fx symbolic tracing (with stack traces and autocast regions), the IR
node of each traced node, and an fx.Interpreter that runs the graph node by node and hands every
value to the observer."""
from __future__ import annotations

import dataclasses
import inspect
import operator
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.fx as fx
from torch.utils._pytree import tree_flatten

from preclint.capture import autocast_regions, ops
from preclint.capture.calls import call_attrs, direct_params, display_target, scalar_args, set_reduction_length
from preclint.capture.frames import model_frames_on_stack
from preclint.capture.model_error import ModelRunError
from preclint.capture.observer import Observer
from preclint.capture.shared_modules import call_site_path, shared_module_paths
from preclint.core.ir import Kind, Node
from preclint.load.modelio import Inputs


FRAMES = "preclint_frames"  # node.meta key: the model's frames that made the node (frames.py)


class _Tracer(fx.Tracer):
    def __init__(self, proxy_buffers: bool = True) -> None:
        super().__init__()
        # (not FX's record_stack_traces: it formats every frame of the stack as text, each line read
        # from its file, for every node; create_node takes the model's frames from the live stack)
        # a buffer read is an attribute node, as a parameter's is: otherwise FX computes what the forward
        # does with buffers alone while tracing (a frozen batch norm's w * (running_var + eps).rsqrt()) and
        # stores the result as a trace constant, so that the ops a cast model runs on the rounded buffer
        # (and the buffer itself) are not in the graph
        self.proxy_buffer_attributes = proxy_buffers
        self._shared: Optional[Dict[int, Tuple[str, ...]]] = None

    def path_of_module(self, mod: torch.nn.Module) -> str:
        # a module held in several places is named after the module whose forward calls it (the scope
        # FX is in), not after its first owner: each call site is a place of its own
        path = super().path_of_module(mod)
        if self._shared is None:
            self._shared = shared_module_paths(self.root)
        if id(mod) in self._shared:
            return call_site_path(self.root, self.scope.module_path, mod, path)
        return path

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return ops.is_leaf_module(m)

    def create_node(self, *args, **kwargs) -> fx.Node:
        node = super().create_node(*args, **kwargs)
        node.meta["autocast"] = autocast_regions.current()  # the region the model's code set around it
        # the model's frames between this hook and trace_fx, innermost first: the line that made the op
        node.meta[FRAMES] = model_frames_on_stack()
        return node


def trace_fx(module: torch.nn.Module, inputs: Any = None) -> fx.GraphModule:
    """Trace ``module`` for a call with ``inputs``: parameters it gives no tensor (None, a flag,
    a default left out) are traced as the constants they are, so that ``if mask is not None``
    takes the branch the call takes; the graph's placeholders are the tensor inputs alone."""
    constants = _constant_arguments(module, Inputs.of(inputs)) if inputs is not None else {}
    with warnings.catch_warnings(), autocast_regions.recording():
        warnings.simplefilter("ignore")  # FX warns about constants it cannot add an assertion for
        try:
            tracer = _Tracer()
            graph = tracer.trace(module, concrete_args=constants or None)
        except Exception:  # noqa: BLE001 - a buffer the forward branches on or reads as a number: as before
            tracer = _Tracer(proxy_buffers=False)
            graph = tracer.trace(module, concrete_args=constants or None)
    if constants:
        _drop_constant_placeholders(graph, module)
    _follow_writes(graph, tracer.root)
    return fx.GraphModule(tracer.root, graph, type(module).__name__)


def _follow_writes(graph: fx.Graph, root: torch.nn.Module) -> None:
    """Make every later reader of a tensor an op writes in place (``state.copy_(h)``,
    ``cache.index_put_(...)``, ``y.mul_(2)``, ``ReLU(inplace=True)``) read that op instead.

    FX records such a call as a node whose result nothing need use: the model goes on reading the
    target's node, and returns it. The runner runs an in-place op out of place (FxRunner), so those
    readers got the values from before the write, and in the IR the output was the node that made
    the tensor (a ``new_zeros``): a recurrent state written step by step was predicted without error.
    Every in-place op returns its target, so reading the op is reading the tensor as it then is."""
    order = {node: i for i, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        target = _written(node, root)
        if target is None:
            continue
        for user in list(target.users):
            if order[user] > order[node]:
                user.replace_input_with(target, node)


def _written(node: fx.Node, root: torch.nn.Module) -> Optional[fx.Node]:
    """The node whose tensor ``node`` writes in place (its first argument, or ``out=``); None otherwise."""
    out = node.kwargs.get("out")
    if isinstance(out, fx.Node):
        return out
    first = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    if first is None:
        return None
    if node.op == "call_module":
        inplace = getattr(root.get_submodule(node.target), "inplace", None) is True
    elif node.op in ("call_method", "call_function"):
        name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
        inplace = (node.kwargs.get("inplace") is True or node.target in ops.INPLACE_OPERATORS
                   or (name.endswith("_") and not name.startswith("_")))
    else:
        inplace = False
    return first if inplace else None


def _constant_arguments(module: torch.nn.Module, inputs: Inputs) -> Dict[str, Any]:
    """FX's concrete_args: forward()'s parameters whose value in this call is a leaf without a tensor."""
    forward = inspect.unwrap(type(module).forward)
    bound = inputs.bind(forward, module)  # TypeError: the call does not fit, FX falls back
    constants = {}
    for name, param in list(inspect.signature(forward).parameters.items())[1:]:
        value = bound.arguments.get(name)
        if param.kind == param.VAR_KEYWORD:
            if value:  # FX has one placeholder for **kwargs and no way to fill it by name
                raise TypeError(f"keyword inputs passed through **{name}")
        elif param.kind != param.VAR_POSITIONAL and (value is None or isinstance(value, (bool, int, float, str))):
            constants[name] = value
    return constants


def _drop_constant_placeholders(graph: fx.Graph, module: torch.nn.Module) -> None:
    """Erase what FX makes of concrete_args (a placeholder per constant, named ``mask_1``, and the
    assertion that it keeps its value): they are not the model's ops, and the graph then runs on the
    tensors alone. A tensor input's placeholder has its parameter's name, which nothing else uses."""
    if type(graph._codegen) is not fx.graph.CodeGen:
        raise TypeError("this torch traces constant inputs through pytree code generation")
    parameters = set(inspect.signature(inspect.unwrap(type(module).forward)).parameters)
    doomed: Dict[fx.Node, None] = {}
    frontier = [n for n in graph.nodes if n.op == "placeholder" and n.target not in parameters
                and not str(n.target).startswith("*")]
    while frontier:
        node = frontier.pop()
        if node not in doomed:
            doomed[node] = None
            frontier.extend(node.users)
    if any(n.op != "placeholder" and n.target not in _SPECIALISATION_CHECKS for n in doomed):
        raise TypeError("a constant input is used as a value")
    for node in reversed(list(graph.nodes)):
        if node in doomed:
            graph.erase_node(node)


_SPECIALISATION_CHECKS = (operator.eq, torch._assert, getattr(fx._symbolic_trace, "_assert_is_none", None))


def fx_arguments(graph: fx.Graph, module: torch.nn.Module, inputs: Any) -> list:
    """The values of the traced graph's placeholders for ``inputs``, in order: the named ones, then
    what ``*args`` takes (the interpreter hands a ``*args`` placeholder all that is left)."""
    inputs = Inputs.of(inputs)
    names = [n.target for n in graph.nodes if n.op == "placeholder" and not str(n.target).startswith("*")]
    if not inputs.kwargs and len(names) == len(inputs.args):  # the common case: no binding needed
        return list(inputs.args)
    forward = inspect.unwrap(type(module).forward)
    arguments = inputs.bind(forward, module).arguments
    rest = [name for name, p in inspect.signature(forward).parameters.items() if p.kind == p.VAR_POSITIONAL]
    return [arguments[name] for name in names] + list(arguments.get(rest[0], ()) if rest else ())


def _fx_ir_node(gm: fx.GraphModule, node: fx.Node) -> Node:
    inputs = tuple(a.name for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, fx.Node))
    frames = node.meta.get(FRAMES, ())
    location = frames[0] if frames else None
    stack = node.meta.get("nn_module_stack") or {}
    owner_path, owner_type = "", type(gm).__name__  # the root module's forward, unless a submodule's
    if stack:
        owner_path, owner_cls = list(stack.values())[-1]
        owner_type = owner_cls if isinstance(owner_cls, str) else getattr(owner_cls, "__name__", str(owner_cls))
        owner_type = owner_type.rsplit(".", 1)[-1].strip("'>")
    elif node.op == "call_function":
        owner_path, owner_type = _weight_owner(gm, node, owner_path, owner_type)
    if node.op == "placeholder":
        return Node(node.name, Kind.INPUT, f"input:{node.target}", fn="input", location=location, stack=frames)
    if node.op == "output":
        return Node(node.name, Kind.OUTPUT, "output", fn="output", inputs=inputs)
    if node.op == "get_attr":
        return Node(node.name, Kind.CONSTANT, f"parameter:{node.target}", fn="parameter", module_path=owner_path,
                    module_type=owner_type, location=location, stack=frames, params=(str(node.target),))
    region = node.meta.get("autocast")
    if node.op == "call_module":
        sub = gm.get_submodule(node.target)
        kind, fn = ops.classify_module(sub)
        attrs = ops.module_attrs(sub)
        return Node(node.name, kind, f"nn.{type(sub).__name__}", fn=fn, module_path=str(node.target),
                    reduction_length=ops.reduction_length(kind, fn, attrs, [], None),
                    module_type=type(sub).__name__, location=location, stack=frames, inputs=inputs, attrs=attrs,
                    params=direct_params(sub, str(node.target)), groups=attrs.get("groups"),
                    scalars={k: float(v) for k, v in attrs.items() if k == "eps"}, autocast=region)
    fn, inplace = ops.function_name(node.target)
    kind = ops.classify_function(fn)
    if _builds_container(node.target):  # FX records a dataclass or named tuple output as its constructor call
        kind = Kind.SHAPE
    args, kwargs = node.args, dict(node.kwargs)
    attrs = call_attrs(fn, kind, args, kwargs)
    if inplace:
        attrs["inplace"] = True
    source = _dtype_source(kind, args, kwargs)
    if source is not None:
        attrs["dtype_of"] = source
    return Node(node.name, kind, display_target(node.target, node.op), fn=fn, module_path=owner_path,
                module_type=owner_type, location=location, stack=frames, inputs=inputs, attrs=attrs,
                scalars=scalar_args(args, kwargs, skip_first=True), groups=attrs.get("groups"), autocast=region)


def _dtype_source(kind: Kind, args, kwargs) -> Optional[str]:
    """The node whose dtype a cast or a new tensor takes (``boxes.to(deltas.dtype)``: FX passes it a
    ``getattr(deltas, "dtype")`` node): the format follows that value's under a mode, not float32."""
    if kind not in (Kind.CAST, Kind.CONSTANT):
        return None
    for a in (*args, *kwargs.values()):
        if (isinstance(a, fx.Node) and a.op == "call_function" and a.target is getattr and len(a.args) == 2
                and a.args[1] == "dtype" and isinstance(a.args[0], fx.Node)):
            return a.args[0].name
    return None


def _weight_owner(gm: fx.GraphModule, node: fx.Node, path: str, type_name: str) -> Tuple[str, str]:
    """The submodule whose weights a call reads where the graph records no module stack (a graph
    of aten ops converted from TorchScript or exported: ``aten.conv2d(x, conv_weight, ...)`` is
    ``conv``'s op); ``path`` and ``type_name`` where it reads none."""
    for arg in node.args:
        if isinstance(arg, fx.Node) and arg.op == "get_attr" and "." in str(arg.target):
            owner = str(arg.target).rsplit(".", 1)[0]
            try:
                return owner, type(gm.get_submodule(owner)).__name__
            except AttributeError:
                return owner, type_name
    return path, type_name


def _builds_container(target: Any) -> bool:
    return isinstance(target, type) and (dataclasses.is_dataclass(target) or issubclass(target, tuple))


def _mutable(value):
    """FX hands a node's list and dict arguments over as immutable_list / immutable_dict; the graph's
    own code builds a fresh list at each call, which the callee may change (torchvision's swin3d
    sets shift sizes in the list it gets)."""
    if isinstance(value, fx.immutable_collections.immutable_list):
        return [_mutable(v) for v in value]
    if isinstance(value, fx.immutable_collections.immutable_dict):
        return {k: _mutable(v) for k, v in value.items()}
    if type(value) is tuple:
        return tuple(_mutable(v) for v in value)
    if type(value) is dict:
        return {k: _mutable(v) for k, v in value.items()}
    return value


class FxRunner(fx.Interpreter):
    """Runs the traced graph, handing each node's values to the observer.

    In-place ops run out of place: the observer keeps each node's output, and an in-place op would
    overwrite the value (and the autograd history) of the node that produced it.
    """

    def __init__(self, gm: torch.nn.Module, ir_nodes: Dict[str, Node], observer: Observer,
                 graph: Optional[fx.Graph] = None, record: bool = True) -> None:
        # ``graph``: run it on ``gm``, any module of the traced hierarchy (no GraphModule to build);
        # ``record``: set the IR nodes' reduction lengths (re-runs of a recorded graph need not)
        super().__init__(gm, graph=graph)
        self.ir_nodes = ir_nodes
        self.observer = observer
        self.record = record

    def run_node(self, n: fx.Node) -> Any:
        node = self.ir_nodes[n.name]
        with self._set_current_node(n), autocast_regions.replaying(
                node.autocast, *_mutable(self.fetch_args_kwargs_from_env(n))) as (args, kwargs):
            callee = None
            if n.op == "call_module":
                callee = self.fetch_attr(n.target)
                # out of place before the observer sees the call, so that it knows what will run
                restore = getattr(callee, "inplace", None) is True
                if restore:
                    callee.inplace = False
                try:
                    args, kwargs = self.observer.before(node, args, kwargs, callee)
                    result = callee(*args, **kwargs)
                finally:
                    if restore:
                        callee.inplace = True
            elif n.op == "call_function":
                target = ops.INPLACE_OPERATORS.get(n.target, n.target)
                if kwargs.get("inplace") is True:
                    kwargs = {**kwargs, "inplace": False}
                callee = target
                args, kwargs = self.observer.before(node, args, kwargs, callee)
                result = target(*args, **kwargs)
            elif n.op == "call_method":
                name = n.target
                obj = args[0]
                if name.endswith("_") and not name.startswith("_") and hasattr(obj, name[:-1]):
                    name = name[:-1]
                callee = name
                args, kwargs = self.observer.before(node, args, kwargs, callee)
                result = getattr(args[0], name)(*args[1:], **kwargs)
            else:
                result = getattr(self, n.op)(n.target, args, kwargs)
            if self.record:
                set_reduction_length(node, args, kwargs, callee)
            return self.observer(node, args, kwargs, callee, result)


def _mark_buffer_views(gm: fx.GraphModule, module: torch.nn.Module, nodes: List[Node]) -> None:
    """A tensor literal of the trace (``_tensor_constant0``) that is a view of one of the model's
    parameters or buffers (``self.inv_freq[None, :]`` computed while tracing, where the trace reads
    buffers as plain tensors: the forward branches on one) records its name in
    ``attrs["view_of"]``: ``model.to`` casts it with the model, and keeping that tensor keeps it."""
    storages = {}
    for name, tensor in list(module.named_buffers()) + list(module.named_parameters()):
        if tensor.is_floating_point():
            storages.setdefault(tensor.untyped_storage().data_ptr(), name)
    for node in nodes:
        if node.fn != "parameter" or not node.params or "_tensor_constant" not in node.params[0]:
            continue
        value = getattr(gm, node.params[0], None)
        if isinstance(value, torch.Tensor) and value.untyped_storage().data_ptr() in storages:
            node.attrs["view_of"] = storages[value.untyped_storage().data_ptr()]


def capture_fx(module: torch.nn.Module, inputs: Any, observer: Optional[Observer],
               traced: Optional[list] = None) -> Tuple[List[Node], Any]:
    gm = trace_fx(module, inputs)  # raises for untraceable code: the caller falls back
    if traced is not None:  # the probe re-runs the traced graph on copies of the model
        traced.append(gm.graph)
    nodes = [_fx_ir_node(gm, n) for n in gm.graph.nodes]
    _mark_buffer_views(gm, module, nodes)
    output = None
    if observer is not None:
        runner = FxRunner(gm, {n.name: n for n in nodes}, observer)
        arguments = fx_arguments(gm.graph, module, inputs)
        try:
            output = runner.run(*arguments)
        except Exception as exc:
            raise ModelRunError(exc) from exc
    return nodes, output
