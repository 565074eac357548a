"""Compiled backends: the model run as ``torch.compile`` (or another compiler) runs it, under a mode.

A ``CompiledBackend`` turns a module into a ``CompiledModel``, a callable whose first call compiles
and which records what the compilation did (``Compilation``: seconds, graphs, graph breaks,
recompilations, the graph it lowered and the kernels it fused, or why it could not compile, in which
case the model runs eagerly). ``CompiledRunner`` is the runner of measure/runners.py that runs a
mode's prepared copy through one, so the probe and the plan's verifier measure a compiled model the
way they measure an eager one.

Each backend is one module of measure/compilers/, found there by its name (``backend_named``).
Inductor (``torch.compile(backend="inductor")``, the CPU included) is the backend that ships. What
another backend would need (ONNX Runtime, TensorRT) is on paper in docs/compiled.md: a ``compile``
that returns a CompiledModel and fills the same record.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Set

import torch

from preclint.load.modelio import Inputs
from preclint.measure.compiled_graph import CompiledGraph
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
