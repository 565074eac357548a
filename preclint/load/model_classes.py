"""Models that are not plain eager float32 modules, made checkable as they are.

A ``torch.compile``d module is checked through the module it wraps (``_orig_mod``), outside Dynamo,
so that Dynamo neither compiles preclint's own hooks nor recompiles for them. A TorchScript module
(``torch.jit.script``, ``torch.jit.trace``, a ``torch.jit.load``ed file) has no Python forward and
takes no hooks: it is checked through its graph, converted to an FX graph of aten ops by torch's
TorchScript converter (the ops and weights it runs, under the names its submodules have). Each
step returns the module to check and the notes that say what was checked instead of what was given.
"""
from __future__ import annotations

import warnings
from typing import List, Tuple

import torch
from torch import nn

from preclint.core.errors import UserError
from preclint.load.modelio import Inputs

__all__ = ["unwrap_compiled", "from_torchscript", "is_torchscript"]


def unwrap_compiled(module: nn.Module, label: str) -> Tuple[nn.Module, List[str]]:
    """The module a ``torch.compile``d one wraps (nested wrappers too), and the note that says so."""
    wrapped = module
    while hasattr(wrapped, "_orig_mod") and isinstance(getattr(wrapped, "_orig_mod"), nn.Module) \
            and type(wrapped).__name__ == "OptimizedModule":
        wrapped = wrapped._orig_mod
    if wrapped is module:
        return module, []
    return wrapped, [f"{label} is a torch.compile'd module: checked the module it compiles ({type(wrapped).__name__}) "
                     "eagerly, outside Dynamo; compiled kernels can fuse and reorder what eager runs "
                     "(`--backend inductor` measures them)"]


def is_torchscript(module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


def from_torchscript(module: nn.Module, call: Inputs, label: str) -> Tuple[nn.Module, List[str]]:
    """An FX GraphModule that runs what the TorchScript ``module`` runs on ``call``, and the note
    that says so; a UserError naming what to pass instead where its graph does not convert."""
    if not is_torchscript(module):
        return module, []
    kind = "traced" if isinstance(module, torch.jit.TopLevelTracedModule) else "scripted"
    try:
        from torch._export.converter import TS2EPConverter

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = TS2EPConverter(module, tuple(call.args), dict(call.kwargs) or None).convert().module()
        graph_module = _plain_graph_module(exported)
    except Exception as exc:  # noqa: BLE001 - the converter's failures are many; each says why in one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{label} is a TorchScript module ({kind}), which takes no hooks, and torch's TorchScript "
                        f"converter could not turn its graph into one preclint reads ({type(exc).__name__}: "
                        f"{reason[:200]}); check the eager nn.Module it was made from instead (its class, with "
                        "the state dict through --weights)") from exc
    return graph_module, [f"{label} is a TorchScript module ({kind}): checked its graph, converted to aten ops by "
                          "torch's TorchScript converter (findings name those ops and the submodules whose weights "
                          "they read); the probe runs the converted graph"]


def _plain_graph_module(exported: nn.Module) -> torch.fx.GraphModule:
    """The exported module as a plain GraphModule (an exported one refuses ``eval()``), without
    the guard that checks its inputs' shapes against the example's (the probe's copies are other
    tensors of those shapes, on other devices)."""
    graph = exported.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target) == "_guards_fn":
            graph.erase_node(node)
    plain = torch.fx.GraphModule(exported, graph)
    if hasattr(plain, "_guards_fn"):
        delattr(plain, "_guards_fn")
    plain.recompile()
    return plain

