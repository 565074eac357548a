"""The model compiled (``--backend inductor``) against the same float64 reference as eager.

Per precision mode, natively on the probe's device (the CPU's own bfloat16/float16 kernels under
``torch.autocast('cpu')`` there: a compiled model cannot be emulated op by op):

* the output error of the eager run and of the compiled run against the float64 reference, their
  difference, and the compiled output against eager's;
* the compiled run again with ``emulate_precision_casts`` (Inductor then rounds every intermediate
  as eager does): what of the difference is the roundings fusion removed;
* the compilation's record: seconds, graphs, graph breaks, recompilations (measure/compiled.py);
* the audit: the dtypes the compiled graph computes in against those eager computed in (a graph of
  another precision: a stale compilation), every float32 decision of the model's own code
  (``autocast(enabled=False)`` regions, ``.float()`` calls) and of a plan checked in the graph, and
  the model's own casts to a reduced format whose rounding a fused kernel removes;
* the attribution to blocks (compiled_blocks.py), where compiled and eager differ by more than
  float32 noise.

A model that cannot compile is measured eagerly, with one note saying why.
"""
from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
import torch._dynamo

from preclint.core.numerics import MODES
from preclint.core.errors import one_line
from preclint.core.ir import Kind
from preclint.core.notes import Note
from preclint.predict.ordinary import FLOAT32_NOISE  # a compiled-vs-eager difference under it is reassociation
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.compare import compare
from preclint.measure.compiled import Compilation, CompiledRunner, eager_dtypes
from preclint.measure.compilers import backend_named
from preclint.measure.compiled_graph import (CompiledNode, KeptSite, computed_dtypes, float_calls, foreign_dtypes,
                                             kept_float32_lost, reduced_user_casts)
from preclint.measure.copies import copy_to
from preclint.core.findings import sci
from preclint.measure.backends import tf32
from preclint.probe.compiled_blocks import attribute, BlockRuns, model_blocks, record_blocks


_COMPUTING = frozenset({Kind.CONV, Kind.LINEAR, Kind.MATMUL, Kind.BATCHNORM, Kind.NORM, Kind.SOFTMAX, Kind.REDUCTION,
                        Kind.SCAN, Kind.ELEMENTWISE, Kind.ACTIVATION, Kind.POOL, Kind.RESAMPLE})


@dataclass
class SiteCheck:
    """One float32 decision (or one reduced cast) checked in the compiled graph."""

    site: KeptSite
    compiled_ops: int  # of the site's ops, how many the compiled graph holds (0: they ran eagerly, or none matched)
    offending: List[CompiledNode] = field(default_factory=list)  # kept: ops in a reduced format; casts: elided

    def to_json(self) -> Dict[str, Any]:
        return {"what": self.site.what, "path": self.site.path, "line": self.site.line,
                "compiled_ops": self.compiled_ops, "holds": not self.offending,
                "offending": [f"{n.name} ({n.dtype}, {n.original})" for n in self.offending[:8]]}


@dataclass
class CompiledMode:
    """One precision mode, eager and compiled."""

    mode: str
    how: str = ""
    eager: Optional[float] = None  # relative RMS against float64
    compiled: Optional[float] = None
    compiled_vs_eager: Optional[float] = None  # ||compiled - eager|| / ||eager||
    emulated_casts: Optional[float] = None  # compiled with emulate_precision_casts, against float64
    emulated_vs_eager: Optional[float] = None  # the same against eager's output
    eager_max_abs: Optional[float] = None
    compiled_max_abs: Optional[float] = None
    finite: bool = True
    compilation: Optional[Compilation] = None
    eager_dtypes: List[str] = field(default_factory=list)
    compiled_dtypes: Dict[str, int] = field(default_factory=dict)
    foreign_dtypes: List[str] = field(default_factory=list)  # reduced formats only the compiled graph computes in
    output_dtypes: Tuple[List[str], List[str]] = ((), ())  # (eager's, compiled's)
    kept: List[SiteCheck] = field(default_factory=list)
    casts: List[SiteCheck] = field(default_factory=list)
    blocks: list = field(default_factory=list)  # compiled_blocks.BlockFigure
    blocks_left: int = 0
    error: Optional[str] = None

    @property
    def difference(self) -> Optional[float]:
        if self.eager is None or self.compiled is None:
            return None
        return self.compiled - self.eager

    def summary(self) -> Dict[str, Any]:
        """The mode's entry in the report's summary (``compiled_output``)."""
        return {"eager_rel_error": self.eager, "compiled_rel_error": self.compiled, "difference": self.difference,
                "compiled_vs_eager": self.compiled_vs_eager, "emulated_casts_rel_error": self.emulated_casts,
                "emulated_vs_eager": self.emulated_vs_eager, "finite": self.finite}

    def to_json(self) -> Dict[str, Any]:
        return {"how": self.how, **self.summary(), "error": self.error,
                "compilation": self.compilation.summary() if self.compilation is not None else None,
                "eager_dtypes": sorted(self.eager_dtypes), "compiled_dtypes": dict(sorted(self.compiled_dtypes.items())),
                "foreign_dtypes": self.foreign_dtypes, "output_dtypes": {"eager": list(self.output_dtypes[0]),
                                                                         "compiled": list(self.output_dtypes[1])},
                "kept_float32": [c.to_json() for c in self.kept], "reduced_casts": [c.to_json() for c in self.casts],
                "blocks": [b.to_json() for b in self.blocks], "blocks_not_attributed": self.blocks_left}


@dataclass
class BackendComparison:
    backend: str
    device: str
    modes: Dict[str, CompiledMode] = field(default_factory=dict)
    notes: List[Note] = field(default_factory=list)
    seconds: float = 0.0

    def to_json(self) -> Dict[str, Any]:
        return {"backend": self.backend, "device": self.device, "seconds": round(self.seconds, 3),
                "modes": {m: c.to_json() for m, c in self.modes.items()}}


# ------------------------------------------------------------------ the model's own float32 decisions


def kept_sites(graph) -> List[KeptSite]:
    """The ``autocast(enabled=False)`` regions of the model's code as the check's graph holds them,
    each with the ops that must compute in float32 there. (Its ``.float()`` calls and its casts to a
    reduced format are read from the compiled graph itself: compiled_graph.float_calls.)"""
    if graph is None:
        return []
    regions: Dict[int, list] = {}
    for n in graph.nodes:
        region = n.autocast
        while region is not None and region.enabled:
            region = region.outer
        if region is not None and n.kind in _COMPUTING and n.location is not None:
            regions.setdefault(region.serial, []).append(n)
    return [_site("autocast(enabled=False) region", nodes) for nodes in regions.values()]


def module_sites(graph, keep: Sequence[Tuple[str, Optional[str]]], what: str = "the plan's kept") -> List[KeptSite]:
    """The sites of a plan's kept units ((module, op or None)): the ops of the module, or of the op in it."""
    sites = []
    for module, op in keep:
        if module.startswith("<"):
            continue
        nodes = [n for n in graph.nodes if (n.module_path == module or not module or n.module_path.startswith(module + "."))
                 and n.kind in _COMPUTING and n.location is not None and (op is None or n.fn == op)]
        if nodes:
            label = f"{what} module '{module or '<root>'}'" + (f" op {op}" if op else "")
            site = _site(label, nodes)
            sites.append(replace(site, module=module) if op is None else site)
    return sites


def _site(what: str, nodes) -> KeptSite:
    first = nodes[0].location
    ops = tuple(dict.fromkeys((os.path.abspath(n.location.path), n.location.line, n.fn) for n in nodes))
    return KeptSite(what, first.path, first.line, ops, nodes[0].name)


def check_sites(nodes: Sequence[CompiledNode], kept: Sequence[KeptSite]):
    """(kept checks, cast checks) against a compiled graph's nodes: the given float32 decisions and
    the code's own ``.float()`` calls; the code's casts to a reduced format, and whether a fused
    kernel removes their rounding."""
    kept_checks = []
    for site in kept:
        lost, held = kept_float32_lost(nodes, site)
        kept_checks.append(SiteCheck(site, held, lost))
    for cast, lost, readers in float_calls(nodes):
        path, line = cast.where or ("", 0)
        kept_checks.append(SiteCheck(KeptSite(".float() call", path, line, ()), readers, lost))
    cast_checks = []
    for cast, elided in reduced_user_casts(nodes):
        path, line = cast.where or ("", 0)
        cast_checks.append(SiteCheck(KeptSite(f"cast to {cast.dtype}", path, line, ()), 1, [cast] if elided else []))
    return kept_checks, cast_checks


# ------------------------------------------------------------------ the comparison


def compare_backend(module32: torch.nn.Module, inputs32, graph, modes: Sequence[str], device, backend: str, *,
                    attribute: bool = True) -> BackendComparison:
    """Every mode of ``modes`` eager and compiled by ``backend``, on ``device`` (module docstring)."""

    start = time.perf_counter()
    device = torch.device(device)
    chosen = backend_named(backend)
    result = BackendComparison(backend, str(device))
    reason = chosen.unavailable(device)
    if reason is not None:
        result.notes.append(Note("compiled", f"not compiled with {backend}: {reason}; the figures are eager's"))
        return result
    inputs32 = Inputs.of(inputs32)
    paths, left = model_blocks(module32) if attribute else ([], 0)
    reference, reference_blocks = _reference(module32, inputs32, device, paths, result.notes)
    kept = kept_sites(graph)
    for mode in modes:
        if device.type == "cpu" and MODES[mode].rounds_products_only:
            result.notes.append(Note("compiled", "tf32 not compiled: the CPU has no TF32"))
            continue
        result.modes[mode] = _one_mode(mode, _Setting(device, chosen, module32, inputs32, reference, kept,
                                                      (paths, left, reference_blocks)))
        torch._dynamo.reset()
    failed = {m: c.compilation.error for m, c in result.modes.items() if c.compilation is not None and c.compilation.error}
    if failed:
        error = next(iter(failed.values()))
        result.notes.append(Note("compiled", f"the model could not be compiled with {backend} ({error}): "
                                             f"{', '.join(failed)} measured eagerly only"))
    result.seconds = time.perf_counter() - start
    return result


def _reference(module32, inputs32, device, paths, notes: List[Note]):
    """(the float64 reference's outputs, its blocks' values); a model that casts its own values to
    float32 and then refuses them beside float64 ones is run in float32 (TF32 off), as the probe does."""

    outputs: list = []
    try:
        with torch.no_grad():
            model64 = copy_to(module32, device, torch.float64)
            inputs64 = inputs32.map(lambda t: t.double() if t.is_floating_point() else t)
            blocks = record_blocks(model64, paths, lambda: outputs.append(inputs64.call(model64)))
    except Exception as exc:  # noqa: BLE001 - float32 is still 2^13 times finer than the modes compared
        notes.append(Note("reference", f"the reference ran in float32 (TF32 off): the model cannot run in float64 "
                                       f"({one_line(exc)})"))
        outputs.clear()
        switch = tf32(False) if device.type == "cuda" else contextlib.nullcontext()
        with torch.no_grad(), switch:
            blocks = record_blocks(module32, paths, lambda: outputs.append(inputs32.call(module32)))
    reference = [t.double() if t.is_floating_point() else t for t in output_tensors(outputs[0])]
    return reference, blocks


@dataclass(frozen=True)
class _Setting:
    """What every mode's comparison shares: the device, the backend, the float32 model and inputs,
    the reference's outputs, the float32 decisions to check, and (blocks, how many more, their
    reference values) for the attribution."""

    device: Any
    backend: Any
    module32: Any
    inputs32: Any
    reference: List[torch.Tensor]
    kept: List[KeptSite]
    blocks: Tuple[List[str], int, Dict[str, Any]]


def _one_mode(mode: str, setting: _Setting) -> CompiledMode:
    device, backend, reference, kept = setting.device, setting.backend, setting.reference, setting.kept
    module32, inputs32 = setting.module32, setting.inputs32
    paths, left, reference_blocks = setting.blocks
    runner = CompiledRunner(mode, device, backend)
    figures = CompiledMode(mode, runner.how)
    prepared = runner.prepare(module32, inputs32)
    call = lambda model: Inputs.of(prepared.inputs).call(model)  # noqa: E731
    outputs: list = []
    dtypes: set = set()

    def eager_run():
        with torch.no_grad(), prepared.context():
            dtypes.update(eager_dtypes(lambda: outputs.append(call(prepared.variant))))

    try:
        eager_blocks = record_blocks(prepared.variant, paths, eager_run)
        eager = output_tensors(outputs[0])
        compiled = output_tensors(runner.run(prepared))
        runner.run(prepared)  # the same inputs again: any graph compiled now is a recompilation
    except Exception as exc:  # noqa: BLE001 - the mode could not run; the other modes are still measured
        figures.error = one_line(exc)
        return figures
    compilation = figures.compilation = runner.compilation(prepared)
    e, c = compare(eager, reference), compare(compiled, reference)
    figures.eager, figures.eager_max_abs = e.rel_rms, e.max_abs
    figures.finite = e.finite and c.finite
    figures.eager_dtypes = sorted(dtypes)
    figures.output_dtypes = ([str(t.dtype).replace("torch.", "") for t in eager],
                             [str(t.dtype).replace("torch.", "") for t in compiled])
    if compilation.error is not None:
        return figures
    figures.compiled, figures.compiled_max_abs = c.rel_rms, c.max_abs
    figures.compiled_vs_eager = compare(compiled, [t.double() if t.is_floating_point() else t for t in eager]).rel_rms
    nodes = compilation.graph.nodes
    figures.compiled_dtypes = computed_dtypes(nodes)
    figures.foreign_dtypes = foreign_dtypes(figures.compiled_dtypes, dtypes)
    figures.kept, figures.casts = check_sites(nodes, kept)
    if _differs(figures.compiled_vs_eager):
        emulating = CompiledRunner(mode, device, backend, emulate_precision_casts=True)
        emulated = output_tensors(emulating.run(prepared))
        figures.emulated_casts = compare(emulated, reference).rel_rms
        figures.emulated_vs_eager = compare(emulated, [t.double() if t.is_floating_point() else t for t in eager]).rel_rms
        if paths:
            runs = BlockRuns(prepared.variant, prepared.context, backend, call, reference, eager, compiled,
                             reference_blocks, eager_blocks)
            figures.blocks = attribute(runs, paths)
            figures.blocks_left = left
    return figures


def _differs(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value) and value > FLOAT32_NOISE


def backend_notes(result: BackendComparison) -> List[Note]:
    """The comparison's lines for the report's notes."""

    notes = [n.prefixed("compiled: ") for n in result.notes]
    for mode, m in result.modes.items():
        if m.error is not None:
            notes.append(Note("compiled", f"compiled: {mode} could not be run: {m.error}"))
            continue
        comp = m.compilation
        if comp is None or comp.error is not None:
            continue
        breaks = sum(comp.graph_breaks.values())
        line = (f"compiled: {mode} with {result.backend} on {result.device}: {comp.graphs} graph(s), {breaks} graph "
                f"break(s), {comp.recompiles} recompilation(s), first call {comp.seconds:.1f} s")
        if breaks:
            line += f" (first: {sorted(comp.graph_breaks)[0][:120]})"
        notes.append(Note("compiled", line))
        if m.emulated_casts is not None:
            notes.append(Note("compiled", f"compiled: {mode} with emulate_precision_casts: output error "
                                          f"{sci(m.emulated_casts)} (eager {sci(m.eager)}, compiled {sci(m.compiled)})"))
        held = [k for k in m.kept if k.compiled_ops and not k.offending]
        if held:
            notes.append(Note("compiled", f"compiled: {mode}: {len(held)} float32 decision(s) of the code hold in the "
                                          "compiled graph"))
        for figure in sorted((b for b in m.blocks if b.part is not None), key=lambda b: -abs(b.part))[:3]:
            text = (f"compiled: {mode}: block {figure.path} holds {figure.part:.0%} of the compiled-vs-eager gap "
                    f"(local error eager {sci(figure.local_eager)}, compiled {sci(figure.local_compiled)}; "
                    f"received {sci(figure.received)})")
            if figure.emulated_back_to_eager is not None:
                text += ("; emulate_precision_casts brings it back to eager" if figure.emulated_back_to_eager
                         else f"; emulate_precision_casts leaves {sci(figure.emulated_residual)} of eager")
            if figure.fused:
                text += f"; fused: {'; '.join(figure.fused[:3])}"
            if figure.elided:
                text += f"; roundings kept in float32: {', '.join(figure.elided[:4])}"
            notes.append(Note("compiled", text))
        parts = [b.part for b in m.blocks if b.part is not None]
        if parts:
            notes.append(Note("compiled", f"compiled: {mode}: the {len(parts)} blocks compiled one at a time hold "
                                          f"{sum(parts):.0%} of the gap together; the rest is the model's own forward "
                                          "between them, or their interplay"))
        if m.blocks_left:
            notes.append(Note("compiled", f"compiled: {mode}: {m.blocks_left} more block(s) not attributed"))
    return notes


def measure_compiled(result, session, streamed: bool) -> None:
    """The modes compiled by the probe's backend beside eager, into ``result.backend``; a streamed
    model is not compiled (its blocks are never on the device at once)."""
    setting, copies = session.setting, session.copies
    backend = setting.options.backend
    if streamed:
        result.backend = BackendComparison(backend, str(setting.device),
                                           notes=[Note("compiled", f"not compiled with {backend}: the model is streamed "
                                                                   "through the device")])
        return
    with session.clock(f"compiled ({backend})"):
        result.backend = compare_backend(copies.model32, copies.inputs32, setting.graph, setting.modes,
                                         setting.device, backend)


def merge_compiled(report, compared: BackendComparison) -> None:
    """The comparison into a report: each mode's ``compiled_output`` in its summary, the notes, and
    the whole record in its environment (``backend``)."""
    for mode, compiled in compared.modes.items():
        if mode in report.summary and compiled.error is None:
            report.summary[mode]["compiled_output"] = compiled.summary()
    report.notes = list(report.notes) + backend_notes(compared)
    report.environment = {**(report.environment or {}), "backend": compared.to_json()}
