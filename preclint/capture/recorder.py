"""The function-mode capture path, for models FX cannot trace (data-dependent control flow, as in
torchvision's detectors): the model runs once under a TorchFunctionMode plus module hooks that record
each leaf-module call and each torch function or tensor method called outside leaf modules."""
from __future__ import annotations

import contextlib
import re
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch.overrides import TorchFunctionMode

try:  # (torch's own helpers for its stack of function modes; where a version lacks them, ``busy`` does it)
    from torch.overrides import _get_current_function_mode as _current_function_mode
    from torch.overrides import _pop_mode as _pop_function_mode
    from torch.overrides import _push_mode as _push_function_mode
except ImportError:  # pragma: no cover
    _current_function_mode = None

from preclint.capture import autocast_regions, ops
from preclint.capture.calls import call_attrs, direct_params, display_target, scalar_args, set_reduction_length
from preclint.capture.frames import model_frames_on_stack
from preclint.capture.shared_modules import call_site_path, shared_module_paths
from preclint.capture.model_error import ModelRunError
from preclint.capture.observer import Observer
from preclint.capture.trees import leaves
from preclint.core.ir import Kind, Node
from preclint.load.modelio import Inputs, output_tensors


# Tensor properties that compute a value (x.T is a transpose): a property reaches a TorchFunctionMode
# as its getter, named "__get__"; the node takes the op the property stands for.
_PROPERTY_OPS = {"T": "t", "mT": "transpose", "H": "t", "mH": "transpose", "data": "detach", "real": "view_as",
                 "imag": "view_as"}


def _property_name(func) -> Optional[str]:
    """``"T"`` for the getter of ``Tensor.T``; None for anything that is not a property getter."""
    if getattr(func, "__name__", None) != "__get__":
        return None
    name = getattr(getattr(func, "__self__", None), "__name__", None)
    return name if isinstance(name, str) else None


_NO_SELF = object()  # a frame not looked at yet (_Recorder._self_of)


class _CalleeFacts:
    """What the recorder reads of a function or method from the callee alone (its op name, kind, whether
    it writes in place, whether it is a Tensor method, how a report names it), once per callee and
    pass: a Llama's forward calls a few dozen callees some thousands of times."""

    __slots__ = ("fn", "inplace", "kind", "prop", "target")

    def __init__(self, func) -> None:
        self.prop = prop = _property_name(func)
        self.fn, self.inplace = ops.function_name(_PROPERTY_OPS.get(prop, prop) if prop else func)
        self.kind = ops.classify_function(self.fn)
        is_method = getattr(func, "__objclass__", None) is torch._C.TensorBase or (
            getattr(func, "__qualname__", "").startswith(("Tensor.", "TensorBase.")))
        if prop:
            self.target = f"Tensor.{prop}"
        elif is_method:
            self.target = f"Tensor.{getattr(func, '__name__', self.fn)}"
        else:
            self.target = display_target(func, "call_function")


class _Unrecorded:
    """The observer's own work, which the recorder passes on unrecorded (``busy``). In a module's
    hooks the recorder is the running function mode, and every op the observer runs would come back
    through its ``__torch_function__`` only to be passed on (tens of thousands of calls a pass, each
    a Python call); so there the recorder leaves torch's mode stack until the observer is done.
    (Within ``__torch_function__`` torch has taken it off already.)"""

    __slots__ = ("recorder", "popped")

    def __init__(self, recorder: "_Recorder") -> None:
        self.recorder = recorder
        self.popped = False

    def __enter__(self) -> None:
        self.recorder.busy = True
        if _current_function_mode is not None and _current_function_mode() is self.recorder:
            _pop_function_mode()
            self.popped = True

    def __exit__(self, *exc) -> None:
        if self.popped:
            _push_function_mode(self.recorder)
        self.recorder.busy = False


class _Recorder(TorchFunctionMode):
    """Records leaf-module calls and top-level torch calls of one eager run."""

    def __init__(self, root: torch.nn.Module, observer: Observer, locate: bool = True) -> None:
        super().__init__()
        self.observer = observer
        # where in the model's code each op is (the stack walked per op): the check's capture needs it
        # for its findings; the probe's runs name nodes by the order they run, and need it not
        self.locate = locate
        self.origin = observer.origin
        self.nodes: List[Node] = []
        self.producer: Dict[int, Tuple[str, torch.Tensor]] = {}  # id(tensor) -> (node name, tensor kept alive)
        self.root = root
        self.paths = {id(m): p for p, m in root.named_modules()}
        self.shared = shared_module_paths(root)  # called from several places: named after each call site
        self.module_stack: List[Tuple[str, str]] = []
        self.leaf_depth = 0
        self.busy = False
        self.counts: Dict[str, int] = {}
        # the last ``x.dtype`` read since an op was recorded: (dtype, the node that made x); see _dtype_source
        self.dtype_read: Optional[Tuple[torch.dtype, str]] = None
        self.bases: Dict[str, str] = {}  # an op's name base as the name makes it (re.sub per op, once)
        self.callees: Dict[Any, _CalleeFacts] = {}
        self.classes: Dict[type, Tuple[bool, str, str]] = {}
        self.owners: Dict[Any, Any] = {}  # frame -> its self (_self_of)
        self.params: Dict[Tuple[int, str], Tuple[str, ...]] = {}  # (module, path) -> what it holds itself
        self.handles = []
        for m in root.modules():
            self.handles.append(m.register_forward_pre_hook(self._pre_hook, with_kwargs=True))
            self.handles.append(m.register_forward_hook(self._post_hook, with_kwargs=True))

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.owners.clear()

    def _self_of(self, frame):
        """The ``self`` of a running method's frame. Reading ``f_locals`` copies every local of the
        frame; a method makes many ops in a row, so the last few frames' answers are kept (the frames
        with them: a frame held cannot be mistaken for a later one at its address)."""
        owner = self.owners.get(frame, _NO_SELF)
        if owner is _NO_SELF:
            if len(self.owners) >= 8:
                self.owners.clear()
            owner = self.owners[frame] = frame.f_locals.get("self")
        return owner

    def _calling_module(self) -> Tuple[str, str]:
        """(path, class) of the module whose method makes the running call: the innermost frame
        whose ``self`` is one of the model's modules. A helper method called directly
        (``self.corr.lookup(x)``: no forward hooks fire) makes its ops the helper module's, as its
        forward would; the module stack of forward calls is the answer otherwise."""
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code.co_argcount and code.co_varnames[0] == "self":
                owner = self._self_of(frame)
                path = self.paths.get(id(owner))
                if path is not None:
                    if id(owner) in self.shared:  # the place of this call: the innermost running one
                        places = self.shared[id(owner)]
                        path = next((p for p, _ in reversed(self.module_stack) if p in places), path)
                    return path, type(owner).__name__
            frame = frame.f_back
        return self.module_stack[-1] if self.module_stack else ("", "")

    def _unique(self, base: str) -> str:
        clean = self.bases.get(base)
        if clean is None:
            clean = self.bases[base] = re.sub(r"\W", "_", base) or "op"
        base = clean
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def _inputs(self, values) -> Tuple[str, ...]:
        names = []
        for v in leaves(values):
            if isinstance(v, torch.Tensor):
                v = self.origin(v)  # an operand view the observer made stands for its tensor
            if isinstance(v, torch.Tensor) and id(v) in self.producer:
                name = self.producer[id(v)][0]
                if name not in names:
                    names.append(name)
        return tuple(names)

    def _reads_float_constant(self, values) -> bool:
        """Whether the op reads a float tensor of at least one dim that no recorded op made (a parameter
        or buffer read directly, ``self.gamma * x``): it keeps its own dtype, float32 under autocast,
        and type promotion computes the op in it (FX records such reads as nodes of their own)."""
        for v in leaves(values):
            if isinstance(v, torch.Tensor):
                v = self.origin(v)
                if v.is_floating_point() and v.dim() >= 1 and id(v) not in self.producer:
                    return True
        return False

    def _dtype_source(self, kind: Kind, args, kwargs) -> Optional[str]:
        """The node whose dtype a cast or a new tensor takes (``boxes.to(deltas.dtype)``,
        ``torch.zeros(n, dtype=x.dtype)``): the tensor whose ``.dtype`` was read right before the call,
        with no op recorded in between (Python reads the argument just before it calls). The reference
        run reads float32 there; under autocast ``deltas`` is float16 and so is the cast (torchvision's
        box decoding computes its boxes in the deltas' dtype), which a fixed dtype would hide."""
        if kind not in (Kind.CAST, Kind.CONSTANT) or self.dtype_read is None:
            return None
        dtype, made_by = self.dtype_read
        given = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.dtype)]
        return made_by if given and given[0] == dtype else None

    def _publish(self, node: Node, args, kwargs, callee, output, *, inplace_target=None, in_mode: bool = False):
        """Hand ``node`` to the observer and note what it produced; ``in_mode``: called from
        ``__torch_function__``, where torch has taken this mode off its stack already."""
        if in_mode:
            self.busy = True
            try:
                set_reduction_length(node, args, kwargs, callee)
                output = self.observer(node, args, kwargs, callee, output)
            finally:
                self.busy = False
        else:
            with _Unrecorded(self):
                set_reduction_length(node, args, kwargs, callee)
                output = self.observer(node, args, kwargs, callee, output)
        self.nodes.append(node)
        self.dtype_read = None
        for v in leaves(output):
            if isinstance(v, torch.Tensor):
                self.producer[id(v)] = (node.name, v)
        if inplace_target is not None:
            self.producer[id(inplace_target)] = (node.name, inplace_target)
        return output

    def add_input(self, name: str, value) -> Any:
        """Record an input; returns what the model is to get for it (the observer may hand it a copy)."""
        node = Node(name, Kind.INPUT, f"input:{name}", fn="input")
        return self._publish(node, (), {}, None, value)

    def _path(self, module) -> str:
        """The module's path; a module held in several places, as the running module calls it."""
        path = self.paths.get(id(module), "")
        if id(module) in self.shared:
            return call_site_path(self.root, self.module_stack[-1][0] if self.module_stack else "", module, path)
        return path

    def _module_class(self, module) -> Tuple[bool, str, str]:
        """(whether a leaf, kind, fn) of a module, by its class: read once per class and pass."""
        cls = type(module)
        found = self.classes.get(cls)
        if found is None:
            leaf = ops.is_leaf_module(module)
            found = self.classes[cls] = (leaf, *ops.classify_module(module)) if leaf else (False, "", "")
        return found

    def _params(self, module, path: str) -> Tuple[str, ...]:
        """The parameters and buffers ``module`` holds itself, by name: read once per module and pass."""
        key = (id(module), path)
        found = self.params.get(key)
        if found is None:
            found = self.params[key] = direct_params(module, path)
        return found

    def _pre_hook(self, module, args, kwargs):
        if self.busy:
            return None
        if self.leaf_depth > 0:
            self.leaf_depth += 1
            return None
        leaf, kind, fn = self._module_class(module)
        if leaf:
            probe = Node("", kind, "", fn=fn, autocast=autocast_regions.current())
            with _Unrecorded(self):
                args, kwargs = self.observer.before(probe, args, kwargs, module)
            module._preclint_inputs = (args, kwargs, probe)
            self.leaf_depth += 1
            return args, kwargs
        self.module_stack.append((self._path(module), type(module).__name__))
        return None

    def _post_hook(self, module, args, kwargs, output):
        if self.busy:
            return None
        if self.leaf_depth > 1:
            self.leaf_depth -= 1
            return None
        if self.leaf_depth == 1:
            self.leaf_depth = 0
            args, kwargs, probe = module.__dict__.pop("_preclint_inputs", (args, kwargs, None))
            path = self._path(module)
            _, kind, fn = self._module_class(module)
            attrs = ops.module_attrs(module)
            frames = model_frames_on_stack() if self.locate else ()
            node = Node(self._unique(path.replace(".", "_") or fn), kind, f"nn.{type(module).__name__}", fn=fn,
                        module_path=path, module_type=type(module).__name__, location=frames[0] if frames else None,
                        stack=frames,
                        inputs=self._inputs((args, kwargs)), attrs=attrs, params=self._params(module, path),
                        groups=attrs.get("groups"), scalars={k: float(v) for k, v in attrs.items() if k == "eps"},
                        autocast=autocast_regions.current())
            self.observer.rename(probe, node.name)
            result = self._publish(node, args, kwargs, module, output)
            return result if result is not output else None
        if self.module_stack:
            self.module_stack.pop()
        return None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.busy or self.leaf_depth > 0:
            return func(*args, **kwargs)
        try:
            facts = self.callees.get(func)
        except TypeError:  # an unhashable callee: read afresh
            facts = None
        if facts is None:
            facts = _CalleeFacts(func)
            try:
                self.callees[func] = facts
            except TypeError:
                pass
        fn, kind = facts.fn, facts.kind
        pending = Node("", kind, "", fn=fn, autocast=autocast_regions.current())
        # torch took this mode off its stack while it runs (the observer's ops are not seen again):
        # only the flag is _Unrecorded's to set here
        self.busy = True
        try:
            args, kwargs = self.observer.before(pending, args, kwargs, func)
        finally:
            self.busy = False
        output = func(*args, **kwargs)
        if facts.prop == "dtype" and args and isinstance(args[0], torch.Tensor):
            made_by = self.producer.get(id(self.origin(args[0])))
            self.dtype_read = (output, made_by[0]) if made_by is not None else None
            return output
        flat_out = [v for v in leaves(output) if isinstance(v, torch.Tensor)]
        inplace = facts.inplace or fn in ("setitem",) or kwargs.get("inplace") is True
        if not flat_out and not inplace:
            return output
        owner_path, owner_type = self._calling_module()
        attrs = call_attrs(fn, kind, args, kwargs)
        if inplace:
            attrs["inplace"] = True
        if kind == Kind.ELEMENTWISE and self._reads_float_constant((args, kwargs)):
            attrs["float_constant"] = True
        source = self._dtype_source(kind, args, kwargs)
        if source is not None:
            attrs["dtype_of"] = source
        frames = model_frames_on_stack() if self.locate else ()
        node = Node(self._unique(fn), kind, facts.target, fn=fn, module_path=owner_path, module_type=owner_type,
                    location=frames[0] if frames else None, stack=frames, inputs=self._inputs((args, kwargs)), attrs=attrs,
                    scalars=scalar_args(args, kwargs, skip_first=True), groups=attrs.get("groups"),
                    autocast=pending.autocast)
        self.observer.rename(pending, node.name)
        target_tensor = args[0] if inplace and args and isinstance(args[0], torch.Tensor) else None
        if not flat_out and target_tensor is not None:
            self._publish(node, args, kwargs, func, target_tensor, inplace_target=target_tensor, in_mode=True)
            return output
        return self._publish(node, args, kwargs, func, output, inplace_target=target_tensor, in_mode=True)


def capture_function_mode(module: torch.nn.Module, inputs: Any, observer: Observer,
                          locate: bool = True) -> Tuple[List[Node], Any]:
    """The nodes of one eager run of ``module`` on ``inputs`` and its output; ``locate``: find each
    node's lines in the model's code."""
    inputs = Inputs.of(inputs)
    recorder = _Recorder(module, observer, locate)
    try:
        given: Dict[int, Any] = {}
        for name, value in inputs.named():
            # an object that holds tensors (a KV cache) is its tensors, which the ops read
            got = recorder.add_input(recorder._unique(name), output_tensors(value) if leaves(value) == [value] else value)
            got = output_tensors(got)
            if isinstance(value, torch.Tensor) and len(got) == 1 and got[0] is not value:
                given[id(value)] = got[0]
        if given:
            inputs = inputs.map(lambda t: given.get(id(t), t))
        try:
            with recorder, autocast_regions.recording():
                output = inputs.call(module)
        except Exception as exc:
            raise ModelRunError(exc) from exc
        out_node = Node("output", Kind.OUTPUT, "output", fn="output", inputs=recorder._inputs(output_tensors(output)))
        recorder.nodes.append(out_node)
        return recorder.nodes, output
    finally:
        recorder.close()


@contextlib.contextmanager
def unseen() -> Iterator[None]:
    """What preclint computes within is no op of the model's: hidden from an eager recording of the run
    (a TorchFunctionMode: the modes are popped for the while) and from autograd."""
    with contextlib.ExitStack() as stack:
        while torch.overrides._get_current_function_mode_stack():
            stack.enter_context(torch.overrides._pop_mode_temporarily())
        stack.enter_context(torch._C.DisableTorchFunction())
        stack.enter_context(torch.no_grad())
        yield
