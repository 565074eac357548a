"""The ways of running a model under a precision mode, one class each.

A Runner has the mode's name and a one-line description of how it runs (``how``, for the report),
makes the copy of the model and inputs the mode runs (``prepare``: a modes.ModeRun) and runs it
unwatched (``run``):

* ``NativeRunner``: the model under the switch a user flips (TF32, ``torch.autocast``, ``.to(dtype)``),
  on the device's own kernels;
* ``EmulatedRunner``: the same arithmetic reproduced by rounding values and computing in float32
  (modes.py), op by op through the capture path the check used, on any device.

A new way (an FP8 format, a compiled backend) is one more subclass: its ``prepare`` makes the copy
its way runs, its ``run`` runs it. The probe's sweep runs the same prepared copy under its observer,
so what a runner returns is what the probe measured.

``run_mode`` and ``run_reference`` are the one-call forms (the accuracy benchmark and the tests'
oracle): the model's output under a mode, and in float64 or float32.
"""
from __future__ import annotations

import abc
from typing import Any, Optional

import torch

from preclint.capture.calls import is_inplace_call
from preclint.capture.graph import capture
from preclint.capture.observer import Observer
from preclint.capture.trees import map_tensors
from preclint.core.ir import Graph, TensorStats
from preclint.core.numerics import MODES
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.backends import tf32
from preclint.measure.copies import copy_to
from preclint.measure.modes import ModeRun, SharedCopies, build_mode_run, describe_mode
from preclint.measure.program import Program


class Runner(abc.ABC):
    """One way of running a model under the precision mode ``name`` on ``device``."""

    emulated = False
    sets_tf32 = True  # TF32 set as the mode says (ModeRun.sets_tf32)

    def __init__(self, name: str, device) -> None:
        if name not in MODES:
            raise ValueError(f"unknown precision mode {name!r}")
        self.name = name
        self.device = torch.device(device)

    @property
    def how(self) -> str:
        """One line for the report: how this runner ran the mode."""
        return describe_mode(self.name, self.device, self.emulated)

    def prepare(self, model32: torch.nn.Module, inputs32, graph: Optional[Graph] = None,
                shared: Optional[SharedCopies] = None, only: Optional[str] = None) -> ModeRun:
        """The copy of ``model32`` (float32, on this runner's device) and of ``inputs32`` the mode
        runs; ``graph``: the check's capture of the model; ``only``: run one module in the mode."""
        return build_mode_run(self, model32, inputs32, graph, shared, only)

    @abc.abstractmethod
    def run(self, prepared: ModeRun, graph: Optional[Graph] = None) -> Any:
        """The output of the prepared copy, unwatched."""

    def output(self, model32: torch.nn.Module, inputs32, graph: Optional[Graph] = None,
               only: Optional[str] = None) -> Any:
        """The model's output under the mode: ``prepare`` and ``run`` in one."""
        return self.run(self.prepare(model32, inputs32, graph, only=only), graph)


class NativeRunner(Runner):
    """The model as a user runs it under the mode, on the device's own kernels. ``sets_tf32=False``
    leaves the TF32 switches as the process has them (a plan is verified as its user deploys it)."""

    def __init__(self, name: str, device, sets_tf32: bool = True) -> None:
        super().__init__(name, device)
        self.sets_tf32 = sets_tf32

    def adopt(self, model: torch.nn.Module, inputs) -> ModeRun:
        """The mode's run of a copy the caller prepared (a plan's policy applied to it)."""
        return ModeRun(self.name, MODES[self.name], self.device, False, model, inputs, self.how,
                       sets_tf32=self.sets_tf32)

    def run(self, prepared: ModeRun, graph: Optional[Graph] = None) -> Any:
        handles = []
        if prepared.only is not None:
            handles = _unit_hooks(prepared, prepared.variant.get_submodule(prepared.only))
        try:
            with torch.no_grad(), prepared.context():
                return Inputs.of(prepared.inputs).call(prepared.variant)
        finally:
            for handle in handles:
                handle.remove()


class EmulatedRunner(Runner):
    """The mode emulated op by op (modes.py), through the capture path the check used; without the
    check's ``graph`` the model is captured first (one float32 run)."""

    emulated = True

    def output(self, model32: torch.nn.Module, inputs32, graph: Optional[Graph] = None,
               only: Optional[str] = None) -> Any:
        graph = capture_graph(model32, inputs32) if graph is None else graph
        return super().output(model32, inputs32, graph, only)

    def run(self, prepared: ModeRun, graph: Optional[Graph] = None) -> Any:
        if graph is None:
            raise ValueError("an emulated run follows the model's graph: capture it first (capture_graph)")
        program = Program(graph, prepared.variant)
        observer = EmulatingObserver(prepared, inplace_semantics=not program.is_fx)
        with torch.no_grad(), prepared.context():
            return program.run(prepared.variant, prepared.inputs, observer)


def emulates_by_default(device) -> bool:
    """Whether the modes are emulated on ``device`` unless asked otherwise: a mode is judged on a GPU's
    kernels, and the CPU has no TF32 and other float16 kernels than a GPU's."""
    return torch.device(device).type == "cpu"


def runner_for(name: str, device, emulated: Optional[bool] = None) -> Runner:
    """The runner of mode ``name`` on ``device``: emulated where the device's kernels are not the
    ones a mode is judged on (``emulates_by_default``) unless ``emulated`` says otherwise. A mode that
    judges float32 itself (``Mode.floor``) has nothing to emulate: its float32 kernels run as they
    are, everywhere."""
    device = torch.device(device)
    if name in MODES and MODES[name].floor:
        return NativeRunner(name, device)
    emulated = emulates_by_default(device) if emulated is None else emulated
    return EmulatedRunner(name, device) if emulated else NativeRunner(name, device)


class ApplyMode(Observer):
    """A prepared mode's arithmetic on each op of a run: ``before`` hands the op its operands as the
    mode has them and keeps, in ``pending``, the operands as they came and the mode's decision for
    the op's result, which ``__call__`` applies. The observers that run a mode build on it:
    EmulatingObserver (nothing more) and the walk beside a recorded run (sweep.py's Sweep), which
    the probe's sweep and diff's parting measure with."""

    def __init__(self, run: ModeRun, inplace_semantics: bool) -> None:
        self.run = run
        self.inplace_semantics = inplace_semantics  # eager recording: in-place ops write their target
        self.pending: Optional[list] = None  # [node or its new name, args, kwargs as they came, the mode's decision]

    def before(self, node, args, kwargs, callee):
        inplace = self.inplace_semantics and is_inplace_call(callee, kwargs)
        new_args, new_kwargs, decision = self.run.before(node, args, kwargs, callee, inplace=inplace)
        self.pending = [node, args, kwargs, decision]
        return new_args, new_kwargs

    def rename(self, node, name) -> None:
        # the recording named the node anew after ``before`` (a name already taken): the pending call follows
        if self.pending is not None and self.pending[0] is node:
            self.pending[0] = name

    @staticmethod
    def pending_for(pending: Optional[list], node) -> bool:
        """Whether ``pending`` is the call of ``node`` (by identity, or by the name it was given since)."""
        return pending is not None and (pending[0] is node or pending[0] == node.name)


class EmulatingObserver(ApplyMode):
    """Applies a prepared emulated mode's arithmetic to each op of a run, and watches nothing. With
    ``only``, the ops of that module alone, whose float results then flow on in float32."""

    def _applies(self, node) -> bool:
        only = self.run.only
        return only is None or node.module_path == only or node.module_path.startswith(only + ".")

    def before(self, node, args, kwargs, callee):
        self.pending = None
        if not self._applies(node):
            return args, kwargs
        return super().before(node, args, kwargs, callee)

    def __call__(self, node, args, kwargs, callee, output):
        pending, self.pending = self.pending, None
        decision = pending[3] if self.pending_for(pending, node) else None
        if not self._applies(node):
            return output
        output = self.run.entering(node, self.run.after(output, decision))
        if self.run.only is not None:
            output = _float32(output)
        return output


def _float32(value):
    """Float results in float32, as a module run alone in the mode hands them on."""
    return map_tensors(lambda t: t.float() if t.is_floating_point() else t, value)


def _unit_hooks(run: ModeRun, module: torch.nn.Module) -> list:
    """Hooks that run ``module`` under the mode's switch and hand its float results on in float32."""
    contexts = []

    def enter(_module, _args):
        contexts.append(run.unit_context())
        contexts[-1].__enter__()

    def leave(_module, _args, output):
        contexts.pop().__exit__(None, None, None)
        return _float32(output)

    return [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]


class _Shapes(Observer):
    """Gives each node of a capture the shapes and dtypes of its outputs (what the modes read of a
    graph: a product's rows), as the check's reference pass does."""

    def __call__(self, node, args, kwargs, callee, output):
        node.outputs = [TensorStats(tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel())
                        for t in output_tensors(output)]
        return output


def capture_graph(model: torch.nn.Module, inputs, name: str = "the model") -> Graph:
    """The graph an emulated run follows, captured as the check captures it (one float32 run)."""
    with torch.no_grad():
        graph, _ = capture(model, Inputs.of(inputs), name, observer=_Shapes())
    return graph


class FirstNonfinite:
    """Forward hooks on the leaf modules of a model that remember the first whose float output is
    inf or NaN (``first``, its path), until ``remove``."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.first: Optional[str] = None
        self.handles = []
        for name, module in model.named_modules():
            if name and not any(True for _ in module.children()):
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def hook(module, args, output) -> Any:
            if self.first is None and any(t.is_floating_point() and not bool(torch.isfinite(t).all())
                                          for t in output_tensors(output)):
                self.first = name
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


def run_mode(model: torch.nn.Module, inputs, mode: str, device="cpu", emulated: Optional[bool] = None,
             graph: Optional[Graph] = None) -> Any:
    """The output of ``model`` (float32, on ``device``) on ``inputs`` under ``mode``, run as
    ``runner_for`` says (emulated on the CPU unless ``emulated`` says otherwise)."""
    device = torch.device(device)
    inputs = Inputs.of(inputs).map(lambda t: t.to(device))
    return runner_for(mode, device, emulated).output(model, inputs, graph)


def run_reference(model: torch.nn.Module, inputs, device="cpu", dtype: Optional[torch.dtype] = torch.float64,
                  sets_tf32: bool = True) -> Any:
    """The output of a copy of ``model`` whose floating tensors, and the inputs', are ``dtype``
    (float64: the reference), on ``device``; ``dtype`` None runs the model as it is (on ``device``
    already: a float32 model's floor, which no mode goes below). TF32 is off on a GPU unless
    ``sets_tf32`` is False (the switches then stay as they are)."""
    device = torch.device(device)
    with torch.no_grad():
        copy = model if dtype is None else copy_to(model, device, dtype)
        inputs = Inputs.of(inputs).map(lambda t: t.to(device, dtype) if dtype is not None and t.is_floating_point()
                                       else t.to(device))
        if sets_tf32 and device.type == "cuda":
            with tf32(False):
                return inputs.call(copy)
        return inputs.call(copy)
