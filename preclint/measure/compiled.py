"""Compiled backends: the model run as ``torch.compile`` (or another compiler) runs it, under a mode.

A ``CompiledBackend`` turns a module into a ``CompiledModel``, a callable whose first call compiles
and which records what the compilation did (``Compilation``: seconds, graphs, graph breaks,
recompilations, the graph it lowered and the kernels it fused, or why it could not compile, in which
case the model runs eagerly). ``CompiledRunner`` is the runner of measure/runners.py that runs a
mode's prepared copy through one, so the probe and the plan's verifier measure a compiled model the
way they measure an eager one.

Inductor (``torch.compile(backend="inductor")``, the CPU included) is the backend that ships. What
another backend would need (ONNX Runtime, TensorRT) is on paper in docs/compiled.md: a ``compile``
that returns a CompiledModel and fills the same record.

Stale compilations. A graph compiled under one autocast dtype has been returned for another (the
AOTAutograd cache key lacked the ambient autocast dtype: pytorch PR 181564; a Dynamo-level hole is
discussed in PR 191110): float16 numbers that are bfloat16's, silently. Every compilation here
starts from ``torch._dynamo.reset()``, with Inductor's FX graph cache and AOTAutograd's cache off and
a post-grad pass whose ``uuid`` is new each time (a fresh cache key), in a cache directory of the run's
own (compile_caches.py: the shared one could hold planted code), and ``foreign_dtypes``
(compiled_graph.py) compares the graph's dtypes with those the eager run computed, so a graph of
another precision is caught even where a cache we do not control served it.
"""
from __future__ import annotations

import abc
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Set

import torch

from preclint.load.modelio import Inputs
from preclint.measure.compile_caches import (AOT_AUTOGRAD_CACHES_OFF, CACHES, INDUCTOR_CACHES_OFF, private_caches,
                                             worker_settings)
from preclint.measure.compiled_graph import CompiledGraph, read_kernels, read_post_grad
from preclint.measure.modes import ModeRun
from preclint.measure.runners import NativeRunner


@dataclass
class Compilation:
    """What one compilation of a model did."""

    backend: str
    settings: Dict[str, Any] = field(default_factory=dict)  # the backend's numerics switches, as set
    seconds: Optional[float] = None  # the first call: compilation and one run
    graphs: int = 0  # graphs compiled by the first call (a graph break makes two)
    graph_breaks: Dict[str, int] = field(default_factory=dict)  # reason (its first line) -> how many
    recompiles: int = 0  # graphs compiled again by later calls on the same inputs
    error: Optional[str] = None  # it could not compile: why (the model then runs eagerly)
    graph: CompiledGraph = field(default_factory=CompiledGraph)

    def summary(self) -> Dict[str, Any]:
        """The record as a report's environment holds it."""
        return {"backend": self.backend, "settings": dict(self.settings),
                "seconds": round(self.seconds, 3) if self.seconds is not None else None,
                "graphs": self.graphs, "graph_breaks": sum(self.graph_breaks.values()),
                "graph_break_reasons": sorted(self.graph_breaks)[:5], "recompiles": self.recompiles,
                "kernels": len(self.graph.kernels), "fused_kernels": sum(k.fused for k in self.graph.kernels),
                "error": self.error}


class CompiledModel:
    """A module as a backend runs it: called like the module; its first call compiles."""

    def __init__(self, module: torch.nn.Module, compilation: Compilation) -> None:
        self.module = module
        self.compilation = compilation

    def __call__(self, *args, **kwargs):
        raise NotImplementedError


class CompiledBackend(abc.ABC):
    """One compiler a model can be run through."""

    name = ""

    def unavailable(self, device: torch.device) -> Optional[str]:
        """Why this backend cannot compile for ``device`` here, or None."""
        return None

    @abc.abstractmethod
    def compile(self, module: torch.nn.Module, *, emulate_precision_casts: bool = False,
                prefix: str = "") -> CompiledModel:
        """``module`` compiled on first call; ``emulate_precision_casts``: round every reduced-precision
        intermediate as eager does; ``prefix``: the module's path in the model (a block compiled alone)."""


class _PostGradRecorder:
    """Inductor's ``post_grad_custom_post_pass``: reads each graph it lowers, changes nothing. Its
    ``uuid`` is new for every compilation, so no cache entry of another one can match its key."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.graphs: List[list] = []
        self.key = uuid.uuid4().hex

    def __call__(self, graph) -> None:
        self.graphs.append(read_post_grad(graph, self.prefix))

    def uuid(self) -> str:
        return self.key


def _custom_pass(recorder: _PostGradRecorder):
    """The recorder as the CustomGraphPass torch asks for (a subclass where torch has the class)."""
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:
        return recorder

    class Recorder(CustomGraphPass):
        def __call__(self, graph) -> None:
            recorder(graph)

        def uuid(self) -> str:
            return recorder.uuid()

    return Recorder()


class InductorModel(CompiledModel):
    def __init__(self, module: torch.nn.Module, compilation: Compilation, prefix: str) -> None:
        super().__init__(module, compilation)
        self.recorder = _PostGradRecorder(prefix)
        self.compiled = None

    @contextlib.contextmanager
    def _settings(self):
        import torch._functorch.config as functorch_config
        import torch._inductor.config as inductor_config

        patches = {"post_grad_custom_post_pass": _custom_pass(self.recorder), **INDUCTOR_CACHES_OFF, **worker_settings(),
                   "emulate_precision_casts": bool(self.compilation.settings["emulate_precision_casts"])}
        patches = {k: v for k, v in patches.items() if hasattr(inductor_config, k)}
        aot_patches = {k: v for k, v in AOT_AUTOGRAD_CACHES_OFF.items() if hasattr(functorch_config, k)}
        with private_caches(), inductor_config.patch(patches), functorch_config.patch(aot_patches):
            yield

    def __call__(self, *args, **kwargs):
        if self.compilation.error is not None:
            return self.module(*args, **kwargs)
        if self.compiled is not None:
            before = len(self.recorder.graphs)
            with self._settings():
                out = self.compiled(*args, **kwargs)
            self.compilation.recompiles += len(self.recorder.graphs) - before
            return out
        return self._first_call(args, kwargs)

    def _first_call(self, args, kwargs):
        import torch._dynamo
        from torch._dynamo.utils import counters

        torch._dynamo.reset()  # nothing compiled before (another mode, another block) is reused
        counters.clear()
        start = time.perf_counter()
        codes: List[str] = []
        try:
            with self._settings():
                self.compiled = torch.compile(self.module, backend="inductor")
                out, codes = _run_and_get_code(self.compiled, args, kwargs)
        except Exception as exc:  # noqa: BLE001 - a model that cannot compile is measured eagerly, with a note
            from preclint.core.errors import one_line

            self.compiled = None
            self.compilation.error = one_line(exc)
            torch._dynamo.reset()
            return self.module(*args, **kwargs)
        self.compilation.seconds = time.perf_counter() - start
        self.compilation.graphs = len(self.recorder.graphs)
        breaks: Dict[str, int] = {}
        for reason, count in counters["graph_break"].items():
            first = str(reason).strip().splitlines()[0] if str(reason).strip() else "graph break"
            breaks[first] = breaks.get(first, 0) + count
        self.compilation.graph_breaks = breaks
        graph = self.compilation.graph
        graph.graphs = len(self.recorder.graphs)
        graph.nodes = [n for nodes in self.recorder.graphs for n in nodes]
        graph.kernels = [k for code in codes for k in read_kernels(code)]
        return out


def _run_and_get_code(fn, args, kwargs):
    """fn's output and the code Inductor generated for it (none where torch cannot say)."""
    try:
        from torch._inductor.utils import run_and_get_code
    except ImportError:
        return fn(*args, **kwargs), []
    return run_and_get_code(lambda: fn(*args, **kwargs))


class InductorBackend(CompiledBackend):
    """``torch.compile(backend="inductor")``: C++/OpenMP kernels on the CPU, Triton on a GPU."""

    name = "inductor"

    def unavailable(self, device: torch.device) -> Optional[str]:
        if not hasattr(torch, "compile"):
            return "this torch has no torch.compile"
        if device.type == "cuda":
            try:
                import triton  # noqa: F401
            except ImportError:
                return "Inductor needs triton for CUDA (pip install triton)"
        return None

    def compile(self, module: torch.nn.Module, *, emulate_precision_casts: bool = False,
                prefix: str = "") -> CompiledModel:
        compilation = Compilation(self.name, {"emulate_precision_casts": emulate_precision_casts,
                                              "caches": CACHES})
        return InductorModel(module, compilation, prefix)


BACKENDS = {"inductor": InductorBackend}
BACKEND_CHOICES = ("eager",) + tuple(BACKENDS)


def backend_named(name: str) -> CompiledBackend:
    """The backend called ``name`` (one of BACKENDS)."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(BACKEND_CHOICES)})")
    return BACKENDS[name]()


class CompiledRunner(NativeRunner):
    """A mode run natively, the mode's copy of the model compiled by ``backend`` (one compilation per
    prepared copy; ``compilation(prepared)`` is its record)."""

    def __init__(self, name: str, device, backend: CompiledBackend, *, emulate_precision_casts: bool = False,
                 sets_tf32: bool = True) -> None:
        super().__init__(name, device, sets_tf32)
        self.backend = backend
        self.emulate_precision_casts = emulate_precision_casts
        self._compiled: Dict[int, CompiledModel] = {}

    @property
    def how(self) -> str:
        extra = ", emulate_precision_casts" if self.emulate_precision_casts else ""
        return f"{super().how}, compiled with {self.backend.name}{extra}"

    def compiled(self, prepared: ModeRun) -> CompiledModel:
        key = id(prepared.variant)
        if key not in self._compiled:
            self._compiled[key] = self.backend.compile(prepared.variant,
                                                       emulate_precision_casts=self.emulate_precision_casts)
        return self._compiled[key]

    def compilation(self, prepared: ModeRun) -> Compilation:
        return self.compiled(prepared).compilation

    def run(self, prepared: ModeRun, graph=None) -> Any:
        if prepared.only is not None:
            raise ValueError("a compiled run compiles the whole copy: compile the unit itself to run it alone")
        model = self.compiled(prepared)
        with torch.no_grad(), prepared.context():
            return Inputs.of(prepared.inputs).call(model)


def eager_dtypes(run) -> Set[str]:
    """The floating dtypes the ops of ``run()`` (an eager run) compute in, as the dispatcher sees them
    below autocast: what a compiled graph of the same mode may compute in."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen: Set[str] = set()

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            name = getattr(func, "__name__", "")
            if not name.startswith(("_to_copy", "to.", "copy", "clone", "view", "detach", "_unsafe_view", "lift")):
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor) and t.is_floating_point():
                        seen.add(str(t.dtype).replace("torch.", ""))
            return out

    with Watch():
        run()
    return seen
