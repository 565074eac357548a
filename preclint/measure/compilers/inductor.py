"""Inductor, ``torch.compile(backend="inductor")``: C++/OpenMP kernels on the CPU, Triton on a GPU.

Stale compilations. A graph compiled under one autocast dtype has been returned for another (the
AOTAutograd cache key lacked the ambient autocast dtype: pytorch PR 181564; a Dynamo-level hole is
discussed in PR 191110): float16 numbers that are bfloat16's, silently. Every compilation here
starts from ``torch._dynamo.reset()``, with Inductor's FX graph cache and AOTAutograd's cache off and
a post-grad pass whose ``uuid`` is new each time (a fresh cache key), in a cache directory of the run's
own (measure/compile_caches.py: the shared one could hold planted code), and ``foreign_dtypes``
(measure/compiled_graph.py) compares the graph's dtypes with those the eager run computed, so a graph of
another precision is caught even where a cache we do not control served it.
"""
from __future__ import annotations

import contextlib
import time
import uuid
from typing import Dict, List, Optional

import torch

from preclint.core.errors import one_line
from preclint.measure.compile_caches import (AOT_AUTOGRAD_CACHES_OFF, CACHES, INDUCTOR_CACHES_OFF, private_caches,
                                             worker_settings)
from preclint.measure.compiled import Compilation, CompiledBackend, CompiledModel
from preclint.measure.compiled_graph import read_kernels, read_post_grad


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


BACKEND = InductorBackend
