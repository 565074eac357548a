"""The probe: the error each node of a model really has under TF32, float16 and bfloat16.

On a GPU it runs the precisions natively; on the CPU it emulates them by rounding (measure/modes.py).
Per mode and node it measures the local and received error, the amplification and the contribution
to the output error (ledger.py), against a float64 reference on the same device; then every finding
is confirmed or refuted (verdict.py), and the rules that judge measurements (such as layers that
hold much of the error without a finding) add theirs.

    result = measure_model(module, inputs, graph, modes, ProbeOptions(device="auto"))
    merge_into_report(report, ctx, result, config, ledger=True)

The passes: the reference (reference_pass.py), the model in float64 on the probe's device, each
node's value kept (in float32 unless the ablation needs float64); the sensitivity (sensitivity.py),
one backward pass per mode with its measured output error as the cotangent: J_i^T E at every node at
once, so each contribution <J_i e_i, E> (gradients only weight errors: bfloat16 autocast on a GPU);
the sweep (sweep.py), the mode's run (measure/runners.py) observed and never altered: each node's
value against the reference's (received), the node replayed on reference inputs (local). Figures
are read back once per pass, after every mode was issued (readback.py): not to stall the GPU.
"""
from __future__ import annotations

import contextlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence, Tuple

from preclint.core.errors import UserError, one_line
from preclint.core.notes import Note
from preclint.capture.heap import long_lived_frozen

from preclint.core.choices import PROBE_BACKEND_CHOICES as BACKEND_CHOICES
from preclint.core.choices import PROBE_DEVICE_CHOICES as DEVICE_CHOICES
from preclint.core.ir import Graph, TensorStats
from preclint.core.progress import task
from preclint.probe.ledger import node_row, ProbeResult
from preclint.probe.mismatch import mismatch_notes
from preclint.probe.verdict import judge, probe_notes, summary_entries
from preclint.reference.degenerate import all_outputs_degenerate
from preclint.rules import rules_to_run

if TYPE_CHECKING:
    from preclint.measure.compare import Tolerance


@dataclass
class ProbeOptions:
    device: str = "auto"  # "auto", "cuda" or "cpu"
    ablate: bool = False  # check contributions against one-node-at-a-time runs
    emulate: Optional[bool] = None  # None: emulate exactly when the device is the CPU
    ledger: bool = False  # put every node's figures in the report (`preclint probe`)
    # wait for the device at each stage's end, so that the timings are each stage's own (benchmarks):
    # otherwise the device works on while Python issues the next stage, and the probe is faster
    sync_stages: bool = False
    # one block of the model on the device at a time (stream.py): None streams exactly when the
    # float64 and float32 copies would not fit the device
    stream: Optional[bool] = None
    # "eager", or a compiled backend (measure/compilers/) measured beside eager against the same
    # float64 reference (probe/compiled.py)
    backend: str = "eager"
    bar: Any = field(default=None, compare=False, repr=False)  # a progress bar (preclint.core.progress) for the stages
    # where the expected outputs are produced (cpu, cuda, cuda:N): float32 there against float32 on the
    # probe's device, each against float64 (measure/devices.py); None: not compared
    reference_device: Optional[str] = None

    def __post_init__(self) -> None:
        if self.device not in DEVICE_CHOICES:
            raise UserError(f"unknown probe device {self.device!r} (choose from {', '.join(DEVICE_CHOICES)})")
        if self.backend not in BACKEND_CHOICES:
            raise UserError(f"unknown backend {self.backend!r} (choose from {', '.join(BACKEND_CHOICES)})")
        if self.reference_device is not None:
            from preclint.measure.devices import reference_device  # lazy: torch-free path

            reference_device(self.reference_device)  # one clear line now, not after the passes


class _Clock:
    """Wall time per stage, with the device synchronised at each boundary so that the time is real."""

    def __init__(self, device, timings: Dict[str, float], sync: bool = True, bar=None) -> None:
        self.device = device
        self.timings = timings
        self.sync = sync
        self.bar = bar  # a progress bar (preclint.core.progress) that shows the stage

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        from preclint.probe.device import synchronize  # lazy: torch-free path

        if self.sync:
            synchronize(self.device)
        if self.bar is not None:
            self.bar.describe(f"probe: {stage}")
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync:
                synchronize(self.device)
            self.timings[stage] = self.timings.get(stage, 0.0) + time.perf_counter() - start
            if self.bar is not None:
                self.bar.advance()


@long_lived_frozen()
def measure_model(module, inputs: tuple, graph, modes: Sequence[str], options: ProbeOptions,
                  tolerance: "Optional[Tolerance]" = None, *, name: str = "the model"):
    """Measure ``module`` (the float32 model the check captured as ``graph``) on ``inputs`` (a tuple
    of positional inputs, or :class:`~preclint.load.modelio.Inputs` with keywords); ``options.bar``, a
    progress bar (preclint.core.progress), follows the stages; ``tolerance``: what the output is judged by
    (None: nothing but finiteness and decisions)."""
    import torch

    from preclint.probe.device import environment, is_out_of_memory, select_device  # lazy: torch-free path
    from preclint.measure.compare import Tolerance  # lazy: torch-free path
    from preclint.measure.copies import copy_to  # lazy: torch-free path
    from preclint.measure.program import Program  # lazy: torch-free path
    from preclint.measure.runners import emulates_by_default  # lazy: torch-free path

    records_graph = graph is None
    if records_graph:
        graph = _graph_to_record(module, inputs, name)
    elif not graph.ran_reference:
        raise UserError("--probe needs the reference pass that --no-run skips; drop --no-run")
    device = select_device(options.device)
    emulated = emulates_by_default(device) if options.emulate is None else options.emulate
    env = environment(device, emulated)
    timings: Dict[str, float] = {}
    bar = options.bar
    clock = _Clock(device, timings, sync=options.sync_stages, bar=bar)
    if bar is not None:  # setup, reference (twice), sensitivity, read back; per mode sweep, contributions, figures, read back
        bar.set_total(5 + len(modes) * (4 + (not emulated) + options.ablate) + (options.reference_device is not None))
    notes: List[Note] = []
    stream = None
    try:
        with clock("setup"):
            program = Program(graph, module)
            # (the user's own model on the CPU is copied as ever: streaming on the CPU is for tests)
            resident = device.type != "cpu" and _whole_on(module, device)
            if streams(options, module, device, resident):
                from preclint.probe.stream import WeightStream  # lazy: torch-free path

                stream = program.stream = WeightStream(module, device)
                # a float32 model on the device already (device_copy.py) is measured as it is
                model32 = module if resident else stream.copy()
                model64 = stream.copy(torch.float64)
                env["streamed"] = {"blocks": len(stream.blocks), "filled_at_once": stream.capacity}
            else:
                with torch.no_grad():
                    model32 = copy_to(module, device)
                    model64 = copy_to(model32, device, torch.float64)
            inputs32 = _move(inputs, device, None)
            inputs64 = _move(inputs32, device, torch.float64)  # from the device's copy: one transfer
    except Exception as exc:
        if is_out_of_memory(exc):
            raise UserError(f"out of memory on {device} while copying {name} there for the probe; "
                            "try a smaller --input-shape, or --probe cpu") from exc
        raise UserError(f"{name} cannot be moved to {device} for the probe: {one_line(exc)}") from exc
    if program.note:
        notes.append(Note("capture", program.note))

    setting = ProbeSetting(graph, tuple(modes), options, tolerance or Tolerance(), name, device, emulated)
    copies = DeviceCopies(program, stream, model32, model64, inputs32, inputs64)
    with stream.active() if stream is not None else contextlib.nullcontext():
        session = ProbeSession(setting, copies, clock, env, notes, records_graph)
        result = session.measure()
        if options.backend != "eager":
            from preclint.probe.compiled import measure_compiled  # lazy: torch-free path

            measure_compiled(result, session, stream is not None)
    if records_graph:
        result.graph = session.setting.graph
    return result


def _graph_to_record(module, inputs, name: str):
    """Where ``measure_model`` is given no graph (a rank measuring beside the check, distributed.py):
    the graph torch.fx traces, as the check's capture does first (no run), or an empty eager one
    that the float64 reference pass records (ProbeSession._recorded_graph). Either has no statistics."""
    from preclint.capture.fx_capture import capture_fx  # lazy: torch-free path

    traced: list = []
    try:
        nodes, _ = capture_fx(module, inputs, None, traced)
    except Exception:  # noqa: BLE001 - as the check's capture: what FX cannot trace is recorded
        return Graph([], name, "function-mode", ran_reference=True)
    return Graph(nodes, name, "fx", ran_reference=True, fx_graph=traced[0])


@dataclass(frozen=True)
class ProbeSetting:
    """What one probe measures, and where: the graph the check captured, the modes, the options, the
    tolerance the output is judged by, and the device (emulating the modes there or not)."""

    graph: Any
    modes: Tuple[str, ...]
    options: ProbeOptions
    tolerance: "Tolerance"
    name: str  # the model, as messages name it
    device: Any
    emulated: bool


@dataclass
class DeviceCopies:
    """The copies of the model and inputs a probe made on its device, and the program that runs them."""

    program: Any  # execute.Program
    stream: Any  # stream.WeightStream, or None
    model32: Any
    model64: Any  # None once only the ablation would need it, and it does not run
    inputs32: Any
    inputs64: Any


class ProbeSession:
    """One probe: its setting, its copies on the device, the clock of its stages, the environment it
    reports and the notes it adds; ``measure`` runs the passes over the copies."""

    def __init__(self, setting: ProbeSetting, copies: DeviceCopies, clock: _Clock, env: Dict[str, Any],
                 notes: List[Note], records_graph: bool = False) -> None:
        self.setting = setting
        self.copies = copies
        self.clock = clock
        self.env = env
        self.notes = notes
        self.records_graph = records_graph  # the graph is the reference pass's (see _recorded_graph)

    def measure(self):
        """The passes of ``measure_model`` over the copies it made: a probe.ledger.ProbeResult."""
        import torch

        setting, copies = self.setting, self.copies
        graph, modes, options, name, device = setting.graph, setting.modes, setting.options, setting.name, setting.device
        env, clock, notes = self.env, self.clock, self.notes
        program, stream, model32, inputs32 = copies.program, copies.stream, copies.model32, copies.inputs32

        from preclint.probe.device import is_out_of_memory, release, tf32_on_gpu  # lazy: torch-free path
        from preclint.measure.program import RunFailed  # lazy: torch-free path
        from preclint.probe.mode_passes import ModePasses  # lazy: torch-free path
        from preclint.probe.reference_pass import reference_pass, resolve_reference  # lazy: torch-free path
        from preclint.probe.sensitivity import sensitivity_pass  # lazy: torch-free path
        from preclint.probe.noise import generator_states, rerun, settle_floor  # lazy: torch-free path

        reference_copy = (copies.model64, copies.inputs64)
        drawn_from = generator_states(device)
        try:
            # TF32 off: values a model computes below float64 even here are then float32's best
            with clock("reference"), tf32_on_gpu(device, False):
                ref = reference_pass(program, copies.model64, copies.inputs64, keep_float64=options.ablate)
        except Exception as exc:
            cause = exc.cause if isinstance(exc, RunFailed) else exc
            if options.ablate or is_out_of_memory(cause):
                raise UserError(_failure(name, "in float64", device, cause)) from cause
            # A model that will not run in float64 (it builds float32 values of its own that its layers
            # then refuse beside float64 ones): float32 with TF32 off is still 2^13 times finer than the
            # modes measured against it.
            release(device)
            try:
                with clock("reference"), tf32_on_gpu(device, False):
                    ref = reference_pass(program, model32, inputs32, keep_float64=False)
            except Exception:
                raise UserError(_failure(name, "in float64", device, cause)) from cause
            notes.append(Note("reference", f"the reference ran in float32 (TF32 off): {name} cannot run in float64 "
                                           f"({one_line(cause)})"))
            env["reference"]["dtype"] = "float32"
            reference_copy = (model32, inputs32)
        with clock("reference: again"), tf32_on_gpu(device, False):  # the noise floor (noise.py)
            again = rerun(program, *reference_copy, known=(device, drawn_from, ref.output))
        if self.records_graph:
            graph = self._recorded_graph(ref)
            self.setting = setting = replace(setting, graph=graph)
        if not options.ablate:
            if stream is not None:
                stream.forget(copies.model64)
            copies.model64 = None  # only the one-node-at-a-time runs need it again: its memory is twice the model's

        # issued while the device still computes the reference: its figures are read after
        sens = None
        autocast = _sensitivity_autocast(device, program)
        for attempt in dict.fromkeys((autocast, None)):  # a model that fails under autocast: float32
            try:
                with clock("sensitivity"), tf32_on_gpu(device, True):
                    sens = sensitivity_pass(program, graph, model32, inputs32, attempt)
                autocast = attempt
                break
            except Exception as exc:  # contributions are lost, the rest of the probe is not
                release(device)
                if attempt is not None:
                    continue
                cause = exc.cause if isinstance(exc, RunFailed) else exc
                reason = "out of memory" if is_out_of_memory(cause) else one_line(cause)
                notes.append(Note("probe", f"contributions not measured: the run with gradients failed ({reason})"))
                autocast = None

        try:
            with clock("reference: read back"):
                resolve_reference(ref)
        except Exception as exc:
            raise UserError(_failure(name, "in float64", device, exc)) from exc
        reference_nonfinite = sorted({n for n, _ in ref.nonfinite}, key=ref.order.index)
        outputs = [t for t in _tensors(ref.output) if t.is_floating_point()]
        if any(not bool(torch.isfinite(t).all()) for t in outputs):
            first = reference_nonfinite[0] if reference_nonfinite else "the output"
            raise UserError(f"the float64 reference of {name} is not finite (first at {first}); "
                            "there is nothing to measure reduced precision against")
        if ref.downcasts:
            shown = ", ".join(ref.downcasts[:3]) + (f" and {len(ref.downcasts) - 3} more" if len(ref.downcasts) > 3 else "")
            notes.append(Note("reference", f"the model computes some values below float64 even in the reference run "
                                           f"({shown}): the reference there is as precise as the model makes it"))

        from preclint.measure.modes import SharedCopies  # lazy: torch-free path

        result = ProbeResult(env, {}, list(ref.order), clock.timings, notes)
        result.reference_nonfinite = reference_nonfinite
        result.noise_floor = settle_floor(ref.output, again, name, env, notes)
        # On a GPU every mode is issued first and read back after: the device never waits for Python in
        # between. The CPU has nothing to overlap: each mode is read back at once, and its copy of the
        # model (rounded weights) is gone before the next one is made.
        passes = ModePasses(self, ref, sens, SharedCopies(stream=stream))
        issued = []
        for mode in modes:
            result.modes[mode], pending = passes.issue(mode)
            if device.type == "cuda":
                issued.append((mode, pending))
            elif pending is not None:
                passes.finish(result.modes[mode], pending)
        if sens is not None:
            sens.close()
        for mode, pending in issued:
            if pending is not None:
                passes.finish(result.modes[mode], pending)
        env["modes"] = {mode: measure.how for mode, measure in result.modes.items()}
        if options.reference_device is not None:
            from preclint.probe.across import measure_across  # lazy: torch-free path

            measure_across(self, result)
        how = ""
        if autocast is not None:
            how = f" under {str(autocast).replace('torch.', '')} autocast (the gradients only weight errors)"
        elif device.type == "cuda":
            how = " (TF32 on: the gradients only weight errors)"
        env["contributions"] = "one backward pass per mode through the float32 model" + how
        return result

    def _recorded_graph(self, ref):
        """The graph the passes run on, completed by the reference pass: an eager recording's nodes
        are that run's, and every node gets its values' shapes (what the modes read of the check's
        statistics: a product's rows, a value's size)."""

        graph, program = self.setting.graph, self.copies.program
        if not program.is_fx:
            graph = Graph(list(program.recorded or ()), graph.model_name, "function-mode", ran_reference=True)
        for node in graph.nodes:
            node.outputs = [TensorStats(tuple(t.shape), str(t.dtype).replace("torch.", ""), t.numel())
                            for t in ref.values.get(node.name, ())]
        return graph


def streams(options: ProbeOptions, module, device, resident: bool = False) -> bool:
    """Whether the probe streams the model's blocks (``options.stream``; by default when its float64
    copy, its float32 copy (unless ``resident`` there already) and a half-precision copy would take
    more than 80% of the device's free memory)."""
    if options.stream is not None:
        return options.stream
    if device.type != "cuda":
        return False
    import torch

    from preclint.probe.stream import model_bytes  # lazy: torch-free path

    free, _ = torch.cuda.mem_get_info(device)
    return (2.5 if resident else 3.5) * model_bytes(module) > 0.8 * free


def _whole_on(module, device) -> bool:
    """Every parameter and buffer of ``module`` on ``device``."""
    tensors = list(module.parameters()) + list(module.buffers())
    return bool(tensors) and all(t.device == device for t in tensors)


def _sensitivity_autocast(device, program):
    """On a GPU the backward passes run in bfloat16: half the memory traffic of float32. Only for
    a traced graph: a model recorded eagerly names its values in the order it runs them, and a
    bfloat16 run could take another branch than the reference's and mislabel them."""
    import torch

    return torch.bfloat16 if device.type == "cuda" and program.is_fx else None


def _move(inputs, device, dtype):
    """The inputs on ``device``; with ``dtype``, floating ones in it (token ids and masks stay)."""
    from preclint.load.modelio import Inputs  # lazy: torch-free path
    from preclint.measure.copies import to_device  # lazy: torch-free path

    def move(v):
        v = to_device(v, device) if v.device != device else v.detach()
        return v.to(dtype) if dtype is not None and v.is_floating_point() else v

    return Inputs.of(inputs).map(move)


def _tensors(value) -> list:
    from preclint.measure.execute import tensors  # lazy: torch-free path

    return tensors(value)


def _failure(name: str, what: str, device, exc: BaseException) -> str:
    from preclint.probe.device import is_out_of_memory  # lazy: torch-free path

    if is_out_of_memory(exc):
        return (f"out of memory on {device} while running {name} {what} for the probe's reference; "
                "try a smaller --input-shape, or --probe cpu")
    return f"{name} cannot run {what} on {device}: {one_line(exc)}"


def merge_into_report(report, ctx, result, config=None, *, ledger: bool = False) -> None:
    """Put the measurements ``result`` into ``report`` (the check whose RuleContext is ``ctx``, with
    its graph): measured figures and statuses, the findings of the rules that judge measurements
    (Rule.check_probe, selected by ``config``), notes, environment; with ``ledger``, every node's
    figures. Where the new findings point, and which are suppressed, the session decides after
    (preclint.engine), for every finding at once."""

    graph = ctx.graph
    degenerate = all_outputs_degenerate(graph)
    judge(report.findings, graph, result, set(result.reference_nonfinite), degenerate)
    if not degenerate:  # shares of rounding residue tell nothing
        flagged = frozenset(f.node for f in report.findings if f.node)
        hot = [finding for rule, rule_ctx in rules_to_run(ctx, config)
               for finding in rule.check_probe(rule_ctx, result, flagged)]
        for finding in hot:
            if finding.location is None:
                finding.location = ctx.model_location
        report.findings = list(report.findings) + hot
    from preclint.probe.across import FLOOR_MODE, across_notes, across_summary  # lazy: torch-free path

    for mode, entry in summary_entries(result, degenerate).items():
        report.summary.setdefault(mode, {"predicted_output": {"rel_error": None, "max_abs_error": None, "finite": None}})
        report.summary[mode]["measured_output"] = entry
        if mode == FLOOR_MODE:
            entry.update(across_summary(result))
    report.notes = [*report.notes, *probe_notes(result, ctx.display), *across_notes(result, ctx), *mismatch_notes(report, ctx, result)]
    report.environment = result.environment
    if getattr(result, "backend", None) is not None:
        from preclint.probe.compiled import merge_compiled  # lazy: torch-free path

        merge_compiled(report, result.backend)
    if ledger:
        report.ledger = [node_row(graph, ctx, result, n.name) for n in graph.nodes if n.kind != "output"]


def place_for_probe(loaded, options: ProbeOptions):
    """The model's float32 copy on the probe's device, which the check's reference pass then runs
    (device_copy.py); None where the reference pass stays on the CPU."""
    from preclint.probe.device import device_mismatch, is_out_of_memory, release, select_device  # lazy: torch-free path
    from preclint.probe.device_copy import place  # lazy: torch-free path

    device = select_device(options.device)
    try:
        return place(loaded.module, loaded.inputs, device)
    except Exception as exc:
        if is_out_of_memory(exc):
            release(device)
            return None  # the reference pass on the CPU; the probe streams
        if device_mismatch(exc) is not None:
            return None  # the reference pass on the CPU; the probe says why it cannot run there
        raise UserError(f"{loaded.name} cannot be moved to {device} for the probe: {one_line(exc)}") from exc


def probed(loaded, placement) -> Tuple[Any, Any]:
    """(module, inputs) the probe measures: the copy on its device where ``placement`` made one."""
    return (loaded.module, loaded.inputs) if placement is None else (placement.model, placement.inputs)


def tolerance_of(rtol: Optional[float], atol: Optional[float]) -> "Tolerance":
    """The tolerance the output is judged by (no bound where the user gave neither rtol nor atol)."""
    from preclint.measure.compare import Tolerance  # lazy: importing the probe imports no torch

    return Tolerance(rtol, atol)


def probe_report(loaded, report, ctx, config, options: ProbeOptions, *, placement=None, measurer=None):
    """``check --probe`` and ``probe``: measure ``loaded`` (its copy on the probe's device, where
    ``placement`` made one), which the check captured as ``ctx.graph``, and merge the results into
    ``report``. ``measurer``: who measures the modes (a model's part of a distributed.py strategy:
    under torchrun rank 0 takes the other ranks' measurements and measures only what they could
    not); None: this process, every mode."""

    tolerance = tolerance_of(ctx.rtol, ctx.atol)
    module, inputs = probed(loaded, placement)
    measure = measure_model if measurer is None else measurer.measure
    with task("probe") as bar:
        result = measure(module, inputs, ctx.graph, ctx.modes, replace(options, bar=bar), tolerance, name=loaded.name)
    if placement is not None:
        result.environment["reference"]["statistics_on"] = str(placement.device)
    merge_into_report(report, ctx, result, config, ledger=options.ledger)
    return result


__all__ = ["BACKEND_CHOICES", "ProbeOptions", "measure_model", "merge_into_report", "place_for_probe", "probe_report", "probed",
           "tolerance_of", "DEVICE_CHOICES"]
