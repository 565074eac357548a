"""Where a compiled model's numbers move: its blocks compiled one at a time, the rest eager.

Compiling the whole model changes many places at once. Compiling one block (a top-level child, a
transformer layer) with everything else eager keeps that block's fusion as whole-model compilation
makes it and isolates what it does to the output:

* ``part``: the block's share of the compiled-vs-eager gap, <d_B, d> / ||d||^2 with d the whole
  compiled output minus eager's and d_B the output with only B compiled minus eager's (shares of
  blocks that act independently add up to 1; interactions make the rest);
* ``local``: the block's own error on the float64 run's inputs, compiled and eager, against the
  block's float64 output (the inputs in the dtypes the eager run hands the block);
* ``received``: the error of the block's inputs in the eager run of the mode, which is what the
  block receives when it alone is compiled;
* for the blocks with the largest parts: the kernels Inductor fused there, the reduced-precision
  values it keeps in float32 (compiled_graph.elided_roundings), and whether
  ``emulate_precision_casts`` brings the block back to eager (its local output then equals eager's).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from preclint.load.modelio import output_tensors
from preclint.core.errors import one_line
from preclint.measure.compare import relative_rms
from preclint.measure.compiled_graph import elided_roundings

MAX_BLOCKS = 16  # blocks attributed per mode (each is one compilation); the rest are listed as not measured
EXPLAINED = 3  # the blocks with the largest parts whose kernels are named and emulation tried


@dataclass
class BlockFigure:
    """One block under one mode."""

    path: str
    part: Optional[float] = None  # share of the compiled-vs-eager output gap
    output_change: Optional[float] = None  # output error with this block compiled, minus eager's
    local_eager: Optional[float] = None
    local_compiled: Optional[float] = None
    received: Optional[float] = None
    fused: List[str] = field(default_factory=list)  # kernels: "cpp_fused_add_mul_tanh_1 [y, z, mul_1]"
    elided: List[str] = field(default_factory=list)  # "mul_1 (bfloat16) at model.py:12"
    emulated_back_to_eager: Optional[bool] = None
    emulated_residual: Optional[float] = None  # |local output with emulation - eager's| / |eager's| (relative RMS)
    graph_breaks: int = 0
    error: Optional[str] = None

    def to_json(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None and v != []}


def model_blocks(model: torch.nn.Module, limit: int = MAX_BLOCKS) -> Tuple[List[str], int]:
    """(the blocks to compile one at a time, how many more there were): the model's top-level
    children, a list of layers (ModuleList, Sequential) replaced by its layers, down to the level
    where a transformer keeps them (``model.layers.0``, ``encoder.layer.0``)."""
    found: List[str] = []

    def holds_layers(module: torch.nn.Module, depth: int) -> bool:
        if isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)) and len(module) >= 2:
            return True
        return depth > 0 and any(holds_layers(c, depth - 1) for c in module.children())

    def walk(prefix: str, module: torch.nn.Module, depth: int) -> None:
        for name, child in module.named_children():
            path = f"{prefix}.{name}" if prefix else name
            if depth < 3 and holds_layers(child, 2 - depth) and any(True for _ in child.children()):
                walk(path, child, depth + 1)
            else:
                found.append(path)

    walk("", model, 0)
    return found[:limit], max(0, len(found) - limit)


class _Swap:
    """``model``'s block at ``path`` replaced by ``replacement`` while entered."""

    def __init__(self, model: torch.nn.Module, path: str, replacement) -> None:
        parent_path, _, self.name = path.rpartition(".")
        self.parent = model.get_submodule(parent_path) if parent_path else model
        self.replacement = replacement

    def __enter__(self):
        self.original = self.parent._modules[self.name]
        self.parent._modules[self.name] = self.replacement
        return self

    def __exit__(self, *exc):
        self.parent._modules[self.name] = self.original
        return False


class _Compiled(torch.nn.Module):
    """A compiled block in the model's place: an nn.Module, so that the model calls it as before."""

    def __init__(self, compiled) -> None:
        super().__init__()
        self.compiled = compiled

    def forward(self, *args, **kwargs):
        return self.compiled(*args, **kwargs)


def record_blocks(model: torch.nn.Module, paths: Sequence[str], run) -> Dict[str, Tuple[Any, Any]]:
    """Each block's (args and kwargs, output) in ``run()`` of ``model``, detached."""
    seen: Dict[str, Tuple[Any, Any]] = {}
    handles = []
    for path in paths:
        module = model.get_submodule(path)

        def hook(_m, args, kwargs, output, path=path):
            if path not in seen:
                detach = lambda v: v.detach() if isinstance(v, torch.Tensor) else v  # noqa: E731
                seen[path] = (torch.utils._pytree.tree_map(detach, (args, kwargs)),
                              torch.utils._pytree.tree_map(detach, output))

        handles.append(module.register_forward_hook(hook, with_kwargs=True))
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return seen



def _like(reference, eager):
    """The float64 run's values in the dtypes the eager run had (the block's inputs as eager feeds it)."""
    ref_leaves, spec = torch.utils._pytree.tree_flatten(reference)
    eager_leaves, _ = torch.utils._pytree.tree_flatten(eager)
    if len(ref_leaves) != len(eager_leaves):
        return reference
    out = [r.to(e.dtype) if isinstance(r, torch.Tensor) and isinstance(e, torch.Tensor) and r.is_floating_point()
           else e for r, e in zip(ref_leaves, eager_leaves)]
    return torch.utils._pytree.tree_unflatten(out, spec)


def _where(node) -> str:
    if node.where is None:
        return ""
    path, line = node.where
    return f" at {path.rsplit('/', 1)[-1]}:{line}"


@dataclass
class BlockRuns:
    """What attributing one mode needs: the mode's copy and its context, the backend, the runs'
    outputs (float64 reference, eager, whole model compiled) and the blocks' recorded values."""

    variant: torch.nn.Module
    context: Any  # a callable returning the mode's context manager
    backend: Any  # measure.compiled.CompiledBackend
    call: Any  # a callable: model -> output (the inputs bound)
    reference: List[torch.Tensor]
    eager: List[torch.Tensor]
    compiled: List[torch.Tensor]
    reference_blocks: Dict[str, Tuple[Any, Any]]
    eager_blocks: Dict[str, Tuple[Any, Any]]


def attribute(runs: BlockRuns, paths: Sequence[str]) -> List[BlockFigure]:
    """Each block's figures (module docstring), the blocks with the largest parts explained."""
    gap = [c.double() - e.double() for c, e in zip(runs.compiled, runs.eager) if c.is_floating_point()]
    gap_sq = sum(float((g * g).sum()) for g in gap)
    eager_error = relative_rms(runs.eager, runs.reference)
    figures, compiled_blocks = [], {}
    for path in paths:
        figure = BlockFigure(path)
        figures.append(figure)
        block = runs.variant.get_submodule(path)
        compiled = runs.backend.compile(block, prefix=path)
        compiled_blocks[path] = compiled
        try:
            with _Swap(runs.variant, path, _Compiled(compiled)), torch.no_grad(), runs.context():
                out = [t for t in output_tensors(runs.call(runs.variant))]
        except Exception as exc:  # noqa: BLE001 - a block that cannot run compiled is reported, the rest measured
            figure.error = one_line(exc)
            continue
        figure.error = compiled.compilation.error
        figure.graph_breaks = sum(compiled.compilation.graph_breaks.values())
        error = relative_rms(out, runs.reference)
        if error is not None and eager_error is not None:
            figure.output_change = error - eager_error
        if gap_sq > 0:
            part = [o.double() - e.double() for o, e in zip((t for t in out if t.is_floating_point()), runs.eager)]
            figure.part = sum(float((p * g).sum()) for p, g in zip(part, gap)) / gap_sq
        _local(runs, path, compiled, figure)
    ranked = sorted((f for f in figures if f.part is not None), key=lambda f: -abs(f.part))
    for figure in ranked[:EXPLAINED]:
        if abs(figure.part) < 0.05:
            break
        _explain(runs, figure, compiled_blocks[figure.path])
    return figures


def _local(runs: BlockRuns, path: str, compiled, figure: BlockFigure) -> None:
    if path not in runs.reference_blocks or path not in runs.eager_blocks:
        return
    (ref_args, ref_kwargs), ref_out = runs.reference_blocks[path]
    (eager_args, eager_kwargs), _ = runs.eager_blocks[path]
    figure.received = relative_rms(torch.utils._pytree.tree_leaves((eager_args, eager_kwargs)),
                              torch.utils._pytree.tree_leaves((ref_args, ref_kwargs)))
    args, kwargs = _like((ref_args, ref_kwargs), (eager_args, eager_kwargs))
    reference = output_tensors(ref_out)
    block = runs.variant.get_submodule(path)
    with torch.no_grad(), runs.context():
        eager_out = output_tensors(block(*args, **kwargs))
        compiled_out = output_tensors(compiled(*args, **kwargs))
    figure.local_eager = relative_rms(eager_out, reference)
    figure.local_compiled = relative_rms(compiled_out, reference)


def _explain(runs: BlockRuns, figure: BlockFigure, compiled) -> None:
    """The fused kernels and elided roundings of the block, and its local output with
    emulate_precision_casts against eager's."""
    graph = compiled.compilation.graph
    figure.fused = [k.name + (f" [{', '.join(k.sources[:6])}{', ...' if len(k.sources) > 6 else ''}]" if k.sources else "")
                    for k in graph.kernels if k.fused][:6]
    figure.elided = [f"{n.name} ({n.dtype}, {n.original}){_where(n)}" for n in elided_roundings(graph.nodes)][:8]
    if figure.path not in runs.reference_blocks or figure.path not in runs.eager_blocks:
        return
    (ref_args, ref_kwargs), _ = runs.reference_blocks[figure.path]
    (eager_args, eager_kwargs), _ = runs.eager_blocks[figure.path]
    args, kwargs = _like((ref_args, ref_kwargs), (eager_args, eager_kwargs))
    block = runs.variant.get_submodule(figure.path)
    emulating = runs.backend.compile(block, emulate_precision_casts=True, prefix=figure.path)
    with torch.no_grad(), runs.context():
        eager_out = output_tensors(block(*args, **kwargs))
        emulated_out = output_tensors(emulating(*args, **kwargs))
    if emulating.compilation.error is not None:
        return
    residual = relative_rms(emulated_out, eager_out)
    figure.emulated_residual = residual
    # back to eager: what is left is float32-sized (reassociated sums), not a reduced format's rounding
    figure.emulated_back_to_eager = residual is not None and residual < 2.0 ** -17.5
