"""The ops of an eager run, recorded once and replayed without the model's Python.

A model FX cannot trace runs under capture's function-mode recorder in every probe pass; for a
Llama-shaped model the model's Python and the recorder's per-op work cost more than the ops. While
the recorder runs, a :class:`Tape` keeps what the model did: each op's callee (a leaf module by its
path, or the torch function), its operands as the model passed them (tensors as slots: an input, a
parameter or buffer by name, an earlier op's result; everything else a constant), and every answer
a tensor gave the model's Python (a size, a dtype). A :class:`Recording` replays that list on any
copy of the model with the same parameter and input shapes, dtypes and devices (and an observer that stores
results in the same dtypes: :func:`regime`), calling the observer exactly as the recorder does, so that the passes see the same nodes and values.

A replay is exactly the model's computation only where the model's Python is a function of what
the recording checks. So a recording is never replayed when the run

* read a tensor's values in Python (``.item()``, ``bool(x)``, ``.tolist()``: control flow may follow),
* drew random numbers at its top level (``torch.randn``; a replay would not redo a reseed),
* wrote its inputs or parameters in place, read a tensor no recorded op made (one kept on a module
  between runs), passed an operand that is no plain constant (a module, a generator),
* set autocast on itself, or ran hooks of its own on modules the recorder walks into;

and nothing is replayed until two eager runs of the model on the same copy recorded the same ops
with the same constants (the reference and its rerun for the noise floor): a model that reads the
time or a counter of its own runs other ops each time. A replay checks every query the recording
made (a size, a dtype) against the replayed value; where one differs (a mode's dtypes changed what
the model's Python would do) the replay stops: :class:`Diverged`.
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from preclint.capture import autocast_regions
from preclint.capture.observer import Observer
from preclint.capture.recorder import _property_name
from preclint.capture.trees import is_leaf, leaves
from preclint.core.ir import Node
from preclint.load.modelio import Inputs

# What a tensor tells the model's Python that a recording can check on the replayed value: its
# metadata. Any other answer (item, tolist, __bool__, __int__, equal, a grad_fn) stops the replay.
_METADATA_QUERIES = frozenset(
    "shape dtype device ndim size dim numel nelement is_cuda is_cpu is_floating_point is_complex stride "
    "is_contiguous element_size get_device __len__ layout is_sparse is_quantized is_meta".split())
# Top-level ops that draw random numbers (modules such as nn.Dropout run their own code on replay).
_RANDOM_OPS = frozenset(
    "rand rand_like randn randn_like randint randint_like randperm bernoulli bernoulli_ multinomial normal "
    "normal_ uniform_ exponential_ geometric_ cauchy_ log_normal_ random_ poisson dropout dropout_ "
    "alpha_dropout feature_alpha_dropout dropout1d dropout2d dropout3d rrelu rrelu_ gumbel_softmax".split())
_CONSTANT_TYPES = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout,
                   torch.memory_format, type(Ellipsis), torch.Size)


class Diverged(Exception):
    """A replay met a query whose answer differs from the recording's: the model's Python could
    take another path here."""


class _Refused(Exception):
    """An operand a replay cannot give again (the message says which)."""


class _Slot:
    """A tensor operand in a template: the replay's value in slot ``index``."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __eq__(self, other) -> bool:
        return type(other) is _Slot and other.index == self.index

    def __hash__(self) -> int:
        return self.index


class _Operands:
    """An op's (args, kwargs) as a replay rebuilds them: for the plain tuples, lists and dicts nearly
    every op takes, a template (the structure with each tensor a _Slot, the rest as given); for
    anything else (a ModelOutput, a named tuple) pytree's spec and leaves."""

    __slots__ = ("template", "spec", "flat", "positions", "indices")

    def __init__(self, template, indices: List[int], spec=None, flat=None, positions=None) -> None:
        self.template, self.indices = template, indices  # indices: the slots it reads, in order
        self.spec, self.flat, self.positions = spec, flat, positions

    def build(self, env: list):
        if self.spec is None:
            return _fill(self.template, env)
        flat = list(self.flat)
        for position, index in zip(self.positions, self.indices):
            flat[position] = env[index]
        return tree_unflatten(flat, self.spec)

    def same(self, other: "_Operands") -> bool:
        if (self.spec, self.indices, self.positions) != (other.spec, other.indices, other.positions):
            return False
        if self.spec is None:
            return _same_template(self.template, other.template)
        return len(self.flat) == len(other.flat) and all(_same_constant(a, b) for a, b in zip(self.flat, other.flat))


def _fill(template, env: list):
    """``template`` with each _Slot replaced by its value: fresh lists and dicts every time (a callee
    may change the list it is given), tuples rebuilt only where they hold a slot."""
    t = type(template)
    if t is _Slot:
        return env[template.index]
    if t is tuple:
        return tuple([_fill(v, env) for v in template])
    if t is list:
        return [_fill(v, env) for v in template]
    if t is dict:
        return {k: _fill(v, env) for k, v in template.items()}
    return template


def _same_template(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if type(a) in (tuple, list):
        return len(a) == len(b) and all(_same_template(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_same_template(a[k], b[k]) for k in a)
    return a == b if type(a) is _Slot else _same_constant(a, b)


def _template(value, slot_of, indices: list):
    """``value`` with each tensor made ``_Slot(slot_of(tensor))`` (in pytree's leaf order, its slot
    appended to ``indices``); _NOT_PLAIN where it holds other containers than plain tuples, lists and dicts
    (a torch.Size is a constant, kept a Size). Raises _Refused for a leaf no replay can give again."""
    t = type(value)
    if isinstance(value, torch.Tensor):
        indices.append(slot_of(value))
        return _Slot(indices[-1])
    if t is tuple or t is list:
        parts = []
        for v in value:
            part = _template(v, slot_of, indices)
            if part is _NOT_PLAIN:
                return _NOT_PLAIN
            parts.append(part)
        return tuple(parts) if t is tuple else parts
    if t is dict:
        if not all(type(k) is str for k in value):
            return _NOT_PLAIN
        parts = {}
        for k, v in value.items():
            part = _template(v, slot_of, indices)
            if part is _NOT_PLAIN:
                return _NOT_PLAIN
            parts[k] = part
        return parts
    _check_constant(value)
    if t is not torch.Size and not is_leaf(value):
        return _NOT_PLAIN
    return value


_NOT_PLAIN = object()  # what _template answers for a container it does not rebuild itself


def _check_constant(value) -> None:
    if isinstance(value, slice):
        if not all(isinstance(v, _CONSTANT_TYPES) for v in (value.start, value.stop, value.step)):
            raise _Refused("takes a slice of tensors")
    elif not isinstance(value, _CONSTANT_TYPES) and is_leaf(value):
        raise _Refused(f"takes a {type(value).__name__}")


def _same_constant(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a is b or a == b


class _Entry:
    """One step of the recording: an input, an op or a query."""

    __slots__ = ("kind", "node", "callee", "operands", "outputs", "target", "grad", "answer", "position")

    def __init__(self, kind: str, node: Node, **fields) -> None:
        self.kind, self.node = kind, node
        self.callee = fields.get("callee")  # a leaf module's path, or the function
        self.operands: Optional[_Operands] = fields.get("operands")
        self.outputs: List[int] = fields.get("outputs", [])  # the slots of the result's tensors, in order
        self.target: Optional[int] = fields.get("target")  # the slot of an in-place op's target
        self.grad: bool = fields.get("grad", False)
        self.answer = fields.get("answer")  # a query's answer
        self.position: int = fields.get("position", 0)  # an input's place in Inputs.named()

    def same(self, other: "_Entry") -> bool:
        if (self.kind, self.node.name, self.outputs, self.target, self.grad, self.position) != (
                other.kind, other.node.name, other.outputs, other.target, other.grad, other.position):
            return False
        if self.kind == "input":
            return True
        same_callee = self.callee == other.callee  # (a property getter is a new method-wrapper each time)
        return same_callee and self.operands.same(other.operands) and (
            self.kind != "query" or _same_constant(self.answer, other.answer))


def _is_float(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def signature(root: torch.nn.Module, inputs) -> Optional[tuple]:
    """What a recording must share with a run to replay it: the model's class and its parameters'
    and buffers' names, shapes, dtypes and devices, the inputs' structure and tensors' metadata, and
    whether the model is in training mode. None where an input is no tensor or plain constant."""
    tensors = tuple((name, t.dtype, tuple(t.shape), t.device)
                    for name, t in list(root.named_parameters()) + list(root.named_buffers()))
    inputs = Inputs.of(inputs)
    flat, spec = tree_flatten((tuple(inputs.args), dict(inputs.kwargs)))
    described = []
    for value in flat:
        if isinstance(value, torch.Tensor):
            described.append((value.dtype, tuple(value.shape), value.device))
        elif isinstance(value, _CONSTANT_TYPES):
            described.append((type(value), value))
        else:
            return None
    return (type(root).__qualname__, root.training, tensors, str(spec), tuple(described))


def regime(observer: Observer) -> tuple:
    """What of an observer decides the dtypes the model's Python reads (part of a recording's key):
    a precision mode's run (``observer.run``, a measure.modes.ModeRun) stores results in its low
    format, in a cast model or autocast's ops, or one module alone (``only``), and the model's code
    reads ``x.dtype`` (Llama's RMSNorm casts back to it). Runs that keep float32 results share ()."""
    run = getattr(observer, "run", None)
    low, only = getattr(run, "low", None), getattr(run, "only", None)
    if low is None and only is None:
        return ()
    return (low, getattr(getattr(run, "mode", None), "autocast", None), only, getattr(run, "emulated", None))


def _refuses_on_error(method):
    """A tape method whose own failure (a case its bookkeeping does not foresee) stops the recording
    with the reason, never the model's run: the model then runs eagerly on every pass, as before."""

    @functools.wraps(method)
    def guarded(self, *args):
        try:
            return method(self, *args)
        except Exception as exc:  # noqa: BLE001 - the recording is lost, not the run
            self.refuse(f"the recording failed ({type(exc).__name__}: {exc})")
            return None

    return guarded


class Tape:
    """Told by the recorder of each input, op and query of one eager run (capture/recorder.py)."""

    def __init__(self, root: torch.nn.Module, inputs) -> None:
        self.entries: List[_Entry] = []
        self.reason: Optional[str] = None  # why this run cannot be replayed
        self.grad = torch.is_grad_enabled()
        self.paths = {id(m): p for p, m in root.named_modules(remove_duplicate=False)}
        self.param_names = {}
        for name, t in list(root.named_parameters()) + list(root.named_buffers()):
            self.param_names.setdefault(id(t), name)
        self.slot_of: Dict[int, int] = {}
        self.kept: List[Any] = []  # the tensors slot_of names, alive while the run is recorded
        self.params: List[Tuple[int, str]] = []  # (slot, name) of each parameter or buffer read
        self.slots = 0
        self.output: Optional[_Operands] = None
        self.inputs = [name for name, _ in Inputs.of(inputs).named()]
        self.input_slots: set = set()
        # slots whose values no pass can change: integer or bool tensors computed from constants
        # alone (the positions torch.arange makes), which the model's Python may read
        self.invariant: set = set()
        hooked = [p for p, m in root.named_modules()
                  if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks]
        if hooked:
            self.refuse(f"the model's modules have hooks of their own ({hooked[0]})")
        if torch.nn.modules.module._global_forward_hooks or torch.nn.modules.module._global_forward_pre_hooks:
            self.refuse("global module hooks are registered")

    def refuse(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason

    def _new_slot(self, tensor) -> int:
        index = self.slots
        self.slots += 1
        self.slot_of[id(tensor)] = index
        self.kept.append(tensor)
        return index

    def _slot_for(self, tensor) -> int:
        index = self.slot_of.get(id(tensor))
        if index is None and id(tensor) in self.param_names:
            index = self._new_slot(tensor)
            self.params.append((index, self.param_names[id(tensor)]))
        if index is None:
            raise _Refused("reads a tensor no recorded op made")
        return index

    def _operands(self, value, where: str) -> Optional[_Operands]:
        try:
            indices: list = []
            template = _template(value, self._slot_for, indices)
            if template is not _NOT_PLAIN:
                return _Operands(template, indices)
            flat, spec = tree_flatten(value)
            positions, indices = [], []
            for position, leaf in enumerate(flat):
                if isinstance(leaf, torch.Tensor):
                    positions.append(position)
                    indices.append(self._slot_for(leaf))
                    flat[position] = None
                else:
                    _check_constant(leaf)
            return _Operands(None, indices, spec, flat, positions)
        except _Refused as exc:
            self.refuse(f"{where} {exc}")
            return None

    @_refuses_on_error
    def input(self, node: Node, value) -> None:
        name = node.target[len("input:"):]
        if name not in self.inputs:
            return self.refuse(f"the input {name} is not one the model was given")
        slots = [self._new_slot(v) for v in leaves(value) if isinstance(v, torch.Tensor)]
        self.input_slots.update(slots)
        self.entries.append(_Entry("input", node, outputs=slots, position=self.inputs.index(name)))

    @_refuses_on_error
    def op(self, node: Node, callee, given, output, target) -> None:
        if self.reason is not None:
            return
        where = f"{node.target} ({node.name})"
        if given is None:
            return self.refuse(f"{where} ran without its module's hooks")
        region = node.autocast
        while region is not None:
            if region.enabled or region.cast_inputs:
                return self.refuse(f"{where} runs in an autocast region the model's code turns on")
            region = region.outer
        if node.fn in _RANDOM_OPS and not isinstance(callee, torch.nn.Module):
            return self.refuse(f"{where} draws random numbers")
        if isinstance(callee, torch.nn.Module):
            callee = self.paths.get(id(callee))
            if callee is None:
                return self.refuse(f"{where} calls a module that is not the model's")
        operands = self._operands(given, where)
        if operands is None:
            return
        if target is not None:
            written = self.slot_of.get(id(target))
            if written is None or written in self.input_slots or any(written == s for s, _ in self.params):
                return self.refuse(f"{where} writes the model's inputs or parameters in place")
        outs = [v for v in leaves(output) if isinstance(v, torch.Tensor)]
        outputs = [self._new_slot(v) for v in outs]
        if all(i in self.invariant for i in operands.indices) and not any(_is_float(v) for v in outs):
            self.invariant.update(outputs)
        target_slot = self._new_slot(target) if target is not None else None
        self.entries.append(_Entry("op", node, callee=callee, operands=operands, outputs=outputs,
                                   target=target_slot, grad=torch.is_grad_enabled()))

    @_refuses_on_error
    def query(self, pending: Node, func, given, answer) -> None:
        if self.reason is not None:
            return
        prop = _property_name(func)
        name = prop or getattr(func, "__name__", str(func))
        operands = self._operands(given, f"Tensor.{name}")
        if operands is None:
            return
        if name not in _METADATA_QUERIES and not all(i in self.invariant for i in operands.indices):
            return self.refuse(f"the model reads a tensor's values in Python (Tensor.{name})")
        self.entries.append(_Entry("query", pending, callee=func, operands=operands, answer=answer))

    def finish(self, output) -> Optional["Recording"]:
        """The recording of the run that returned ``output``; None where it cannot be replayed."""
        if self.reason is None:
            self.output = self._operands(output, "the model's output")
        self.slot_of.clear()
        self.kept.clear()
        if self.reason is not None:
            return None
        return Recording(self)


class Recording:
    """One eager run's ops, replayable on copies of the model (see the module's docstring)."""

    def __init__(self, tape: Tape) -> None:
        self.entries = tape.entries
        self.params = tape.params
        self.slots = tape.slots
        self.output = tape.output
        self.grad = tape.grad  # recorded with autograd on: it knows where the model's code turned it off
        self.nodes = [e.node for e in self.entries if e.kind != "query"]
        # the slots to let go after each entry, at their last read: a replay holds no value longer
        # than the model would (the observers keep what they keep)
        last: Dict[int, int] = {}
        for k, entry in enumerate(self.entries):
            for index in (entry.operands.indices if entry.operands is not None else ()):
                last[index] = k
            for index in entry.outputs + ([entry.target] if entry.target is not None else []):
                last[index] = k
        kept = set(self.output.indices)
        self.frees: List[Tuple[int, ...]] = [() for _ in self.entries]
        for index, k in last.items():
            if index not in kept:
                self.frees[k] += (index,)

    def same(self, other: "Recording") -> bool:
        """Whether ``other`` made the same ops on the same operands and got the same answers."""
        return (len(self.entries) == len(other.entries) and self.params == other.params
                and self.output.same(other.output) and all(a.same(b) for a, b in zip(self.entries, other.entries)))

    def run(self, root: torch.nn.Module, inputs, observer: Observer) -> Any:
        """The model's output, the ops replayed on ``root`` and ``inputs`` under ``observer``."""
        env: list = [None] * self.slots
        for index, name in self.params:
            env[index] = _tensor_at(root, name)
        named = Inputs.of(inputs).named()
        modules: Dict[str, torch.nn.Module] = {}
        grad = torch.is_grad_enabled()
        for entry, frees in zip(self.entries, self.frees):
            if entry.kind == "input":
                value = named[entry.position][1]
                observer(entry.node, (), {}, None, value)
                for index, v in zip(entry.outputs, [v for v in leaves(value) if isinstance(v, torch.Tensor)]):
                    env[index] = v
            else:
                callee = entry.callee
                if isinstance(callee, str):
                    callee = modules.get(callee)
                    if callee is None:
                        callee = modules[entry.callee] = root.get_submodule(entry.callee)
                _run_entry(entry, observer, callee, env, grad)
            for index in frees:
                env[index] = None
        return self.output.build(env)


def _tensor_at(root: torch.nn.Module, name: str) -> torch.Tensor:
    """The parameter or buffer ``name`` of ``root`` (as get_parameter finds it, a buffer too)."""
    module_path, _, leaf = name.rpartition(".")
    module = root.get_submodule(module_path) if module_path else root
    found = module._parameters.get(leaf)
    return found if found is not None else module._buffers[leaf]


def _run_entry(entry: _Entry, observer: Observer, callee, env: list, grad: bool) -> None:
    args, kwargs = entry.operands.build(env)
    autocast = entry.node.autocast
    if autocast is None and (entry.grad or not grad):
        return _step(entry, observer, callee, args, kwargs, env)
    # as the model's code ran it: autograd off where it turned it off, autocast off in its
    # autocast(enabled=False) regions where a mode turns autocast on
    with contextlib.ExitStack() as stack:
        if grad and not entry.grad:
            stack.enter_context(torch.no_grad())
        args, kwargs = stack.enter_context(autocast_regions.replaying(autocast, args, kwargs))
        _step(entry, observer, callee, args, kwargs, env)


def _step(entry: _Entry, observer: Observer, callee, args, kwargs, env: list) -> None:
    """One op or query of a replay, the observer told as the recorder tells it."""
    node = entry.node
    pending = Node("", node.kind, "", fn=node.fn, autocast=node.autocast)
    args, kwargs = observer.before(pending, args, kwargs, callee)
    output = callee(*args, **kwargs)
    if entry.kind == "query":
        if not _same_constant(output, entry.answer):
            raise Diverged(f"{getattr(callee, '__name__', 'a query')} answered {output!r}, "
                           f"not {entry.answer!r} as recorded")
        return
    observer.rename(pending, node.name)
    target = args[0] if entry.target is not None else None
    if target is not None and not [v for v in leaves(output) if isinstance(v, torch.Tensor)]:
        output = target  # setitem and its kind return nothing: the recorder hands on the target
    output = observer(node, args, kwargs, callee, output)
    outs = [v for v in leaves(output) if isinstance(v, torch.Tensor)]
    if len(outs) != len(entry.outputs):
        raise Diverged(f"{node.name} returned {len(outs)} tensors, not {len(entry.outputs)} as recorded")
    for index, v in zip(entry.outputs, outs):
        env[index] = v
    if target is not None:
        env[entry.target] = target
