"""Running one copy of the model through the capture path the check used, with an observer.

Every run of a model under a precision (the float64 reference, each precision mode, the probe's
sensitivity pass and one-layer-at-a-time runs) executes the same ops in the same order, so their
values line up node by node by name:

* FX models: the graph the check traced is re-rooted on each copy of the model; capture's
  interpreter runs it and hands each value to the observer. A run can start part-way, from values of an earlier run (``initial_env``).
* Models FX cannot trace: capture's function-mode recorder runs the copy eagerly; its node names are
  assigned in execution order, so they match as long as control flow does (the probe checks).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.fx as fx

from preclint.capture import ops
from preclint.capture.fx_capture import FxRunner, fx_arguments
from preclint.capture.model_error import ModelRunError
from preclint.capture.observer import Observer
from preclint.capture.recorder import capture_function_mode
from preclint.core.errors import one_line
from preclint.core.ir import Graph
from preclint.load.modelio import Inputs


class _Tracer(fx.Tracer):
    """capture's tracer without stack traces (for graphs built without the check's trace): the same
    leaves, so the same nodes and names."""

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        return ops.is_leaf_module(m)


class RunFailed(Exception):
    """The model raised while it ran under an observer; ``cause`` is the original exception."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(one_line(cause))
        self.cause = cause


class Program:
    """The model as it is executed on any copy (float64, float16, rounded weights)."""

    def __init__(self, graph: Graph, module: torch.nn.Module) -> None:
        self.ir_nodes = {n.name: n for n in graph.nodes}
        self.order = [n.name for n in graph.nodes]
        self.fx_graph: Optional[fx.Graph] = None
        self.note: Optional[str] = None
        self.stream = None  # the WeightStream the copies' blocks are filled from, when streamed
        self.recorded: Optional[list] = None  # the nodes the last eager run recorded
        if graph.capture == "fx":
            traced = graph.fx_graph if graph.fx_graph is not None else _Tracer().trace(module)
            if [n.name for n in traced.nodes] == self.order:
                self.fx_graph = traced
            else:  # cannot happen for a deterministic trace; run eagerly rather than mislabel values
                self.note = "the model traced differently a second time; the probe recorded its ops eagerly instead"
        self._fx_nodes = {n.name: n for n in self.fx_graph.nodes} if self.fx_graph is not None else {}

    @property
    def is_fx(self) -> bool:
        return self.fx_graph is not None

    def run(self, root: torch.nn.Module, inputs, observer: Observer, initial_env: Optional[Dict[str, Any]] = None):
        """The model's output on ``inputs`` (a tuple, or Inputs with keywords); ``initial_env`` (FX
        only) maps node names to values not to recompute."""
        if self.stream is not None:
            observer = self.stream.observing(observer, root)
        # each run on copies of the inputs: a forward that writes into one (a recurrent state stored
        # in place, as transformers' RWKV does) would change what every later run reads, and writing
        # into an input that requires grad fails where a copy of it does not
        inputs = Inputs.of(inputs).map(lambda t: t.clone())
        try:
            if self.fx_graph is None:
                self.recorded, output = capture_function_mode(root, inputs, observer, locate=False)
                return output
            # the graph runs on the copy itself: its call_module and get_attr targets are the copy's;
            # the check recorded the reduction lengths from the same shapes already
            runner = FxRunner(root, self.ir_nodes, observer, graph=self.fx_graph, record=False)
            env = {self._fx_nodes[name]: value for name, value in (initial_env or {}).items()}
            return runner.run(*fx_arguments(self.fx_graph, root, inputs), initial_env=env or None)
        except ModelRunError as exc:
            raise RunFailed(exc.cause) from exc.cause
        except RunFailed:
            raise
        except Exception as exc:
            raise RunFailed(exc) from exc
