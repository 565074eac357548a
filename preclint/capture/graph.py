"""Graph capture's entry point: an nn.Module and its example inputs -> ir.Graph, by the first of
two paths that works, both producing the same IR:

* ``fx`` (fx_capture.py): torch.fx symbolic tracing (with stack traces), then, unless told not to
  run, an fx.Interpreter that executes the graph node by node and hands every value to an observer.
* ``function-mode`` (recorder.py): for models FX cannot trace (data-dependent control flow, as in
  torchvision's detectors), the model runs once under a TorchFunctionMode plus module hooks that
  record each leaf-module call and each torch function or tensor method called outside leaf modules.

The observer (reference/statistics_pass.py) sees ``(node, args, kwargs, callee, output)`` for each op on either path.
"""
from __future__ import annotations

import warnings
from typing import Any, List, Optional, Tuple

import torch

from preclint.capture.autograd_state import release_autograd_state, tensors_with_history
from preclint.capture.fx_capture import capture_fx
from preclint.capture.model_error import ModelRunError
from preclint.capture.observer import Observer
from preclint.capture.recorder import capture_function_mode
from preclint.core.errors import UserError, one_line
from preclint.core.ir import Graph
from preclint.core.notes import Note
from preclint.load.modelio import Inputs


def capture(
    module: torch.nn.Module,
    inputs: Any,
    name: str,
    observer: Optional[Observer] = None,
    source_path: Optional[str] = None,
    force: Optional[str] = None,
) -> Tuple[Graph, Any]:
    """Capture ``module`` as a Graph; with an observer also run it on ``inputs`` (a tuple of
    positional inputs, or :class:`~preclint.load.modelio.Inputs` with keywords).

    Returns the graph and the model's output (None when not run). ``force`` picks a path ("fx" or
    "function-mode") instead of trying FX first.
    """
    keep = set(tensors_with_history(module)) if observer is not None else set()
    try:
        with warnings.catch_warnings():
            # the inputs require gradients because preclint asked: the model's .item() calls would warn
            warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad=True to a scalar")
            return _capture(module, inputs, name, observer, source_path, force)
    finally:
        if observer is not None:
            release_autograd_state(module, keep)


def _capture(module, inputs, name, observer, source_path, force) -> Tuple[Graph, Any]:
    notes: List[Note] = []
    if force != "function-mode" and Inputs.of(inputs).holds_objects():
        # torch.fx would pass such an input as one opaque value and record its methods (a cache's
        # update) as single calls: the ops inside them are seen by recording a run
        if force == "fx":
            raise UserError(f"torch.fx cannot trace {name}: an input is an object that holds tensors (a cache)")
        notes.append(Note("capture", "an input is an object that holds tensors (a cache), which torch.fx cannot see "
                                     "into; recorded the ops of one run instead"))
        force = "function-mode"
    if force != "function-mode":
        try:
            traced: list = []
            state = _python_state(module)
            nodes, output = capture_fx(module, inputs, observer, traced)
            notes += _state_changed_notes(name, state, _python_state(module))
            graph = Graph(nodes, name, "fx", source_path=source_path, notes=notes, fx_graph=traced[0])
            return graph, output
        except Exception as exc:  # FX raises many types for untraceable code; the fallback handles them all
            if force == "fx":
                raise UserError(f"torch.fx cannot trace {name}: {one_line(exc)}") from exc
            if _is_model_error(exc):
                # the traced graph failed where the model itself may not (code that only works
                # eagerly): the eager run decides, with an observer that forgets the partial run
                if not observer.reset():
                    raise
                notes.append(Note("capture", f"running the graph torch.fx traced failed ({exc}); recorded the ops of one "
                                             "run instead"))
            else:
                notes.append(Note("capture", f"torch.fx could not trace the model ({one_line(exc)}); recorded the ops of "
                                             "one run instead"))
    if observer is None:
        raise UserError(
            f"torch.fx cannot trace {name} and --no-run forbids recording a run; drop --no-run to capture it"
        )
    nodes, output = capture_function_mode(module, inputs, observer)
    return Graph(nodes, name, "function-mode", source_path=source_path, notes=notes), output


_SCALARS = (bool, int, float, str)


def _python_state(module) -> dict:
    """The plain values (numbers, flags, strings) each submodule holds as attributes: what a forward that
    counts its calls or keeps a step changes, which torch.fx bakes into the graph as constants."""
    return {(path, key): value for path, sub in module.named_modules() for key, value in vars(sub).items()
            if isinstance(value, _SCALARS)}


def _state_changed_notes(name: str, before: dict, after: dict) -> List[Note]:
    changed = [(key, before.get(key), value) for key, value in after.items() if before.get(key, value) != value]
    if not changed:
        return []
    (path, attr), old, new = changed[0]
    more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
    return [Note("capture", f"{name}'s forward changes its own attributes ({'.'.join(filter(None, (path, attr)))}: "
                            f"{old!r} -> {new!r}{more}): torch.fx traced the values of one call, so the graph checked "
                            "and probed gives the same output on every run while the model may not: it is not "
                            "deterministic from call to call")]


def _is_model_error(exc: BaseException) -> bool:
    return isinstance(exc, ModelRunError)
