"""The probe: the error each node of a model really has under TF32, float16 and bfloat16.

On a GPU it runs the precisions natively; on the CPU it emulates them by rounding (modes.py). Per
mode and node it measures the local and received error, the amplification and the contribution to
the output error (ledger.py), against a float64 reference on the same device; then every finding
is confirmed or refuted (verdict.py), and the rules that judge measurements (such as layers that
hold much of the error without a finding) add theirs.

    result = measure_model(module, inputs, graph, modes, ProbeOptions(device="auto"))
    apply(report, loaded, graph, ctx, config, result, ledger=True)
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from preclint.errors import UserError, one_line

DEVICE_CHOICES = ("auto", "cuda", "cpu")


@dataclass
class ProbeOptions:
    device: str = "auto"  # "auto", "cuda" or "cpu"
    ablate: bool = False  # check contributions against one-node-at-a-time runs
    emulate: Optional[bool] = None  # None: emulate exactly when the device is the CPU
    ledger: bool = False  # put every node's figures in the report (`preclint probe`)
    # wait for the device at each stage's end, so that the timings are each stage's own (benchmarks):
    # otherwise the device works on while Python issues the next stage, and the probe is faster
    sync_stages: bool = False

    def __post_init__(self) -> None:
        if self.device not in DEVICE_CHOICES:
            raise UserError(f"unknown probe device {self.device!r} (choose from {', '.join(DEVICE_CHOICES)})")


class _Clock:
    """Wall time per stage, with the device synchronised at each boundary so that the time is real."""

    def __init__(self, device, timings: Dict[str, float], sync: bool = True, bar=None) -> None:
        self.device = device
        self.timings = timings
        self.sync = sync
        self.bar = bar  # a progress bar (preclint.progress) that shows the stage

    @contextmanager
    def __call__(self, stage: str) -> Iterator[None]:
        from preclint.probe.device import synchronize

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


def measure_model(module, inputs: tuple, graph, modes: Sequence[str], options: ProbeOptions,
                  tolerance: Optional[Tuple[float, float]] = None, name: str = "the model", bar=None):
    """Measure ``module`` (the float32 model the check captured as ``graph``) on ``inputs`` (a tuple
    of positional inputs, or :class:`~preclint.modelio.Inputs` with keywords); ``bar``, a progress
    bar (preclint.progress), follows the stages."""
    import torch

    from preclint.probe.device import environment, is_out_of_memory, select_device
    from preclint.probe.execute import Program, RunFailed, copy_to
    from preclint.probe.measure import reference_pass, resolve_reference, sensitivity_pass

    if not graph.ran_reference:
        raise UserError("--probe needs the reference pass that --no-run skips; drop --no-run")
    device = select_device(options.device)
    emulated = device.type == "cpu" if options.emulate is None else options.emulate
    env = environment(device, emulated)
    timings: Dict[str, float] = {}
    clock = _Clock(device, timings, sync=options.sync_stages, bar=bar)
    if bar is not None:  # setup, reference, sensitivity, read back; per mode sweep, contributions, figures, read back
        bar.set_total(4 + len(modes) * (4 + (not emulated) + options.ablate))
    notes: List[str] = []
    try:
        with clock("setup"):
            program = Program(graph, module)
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
        notes.append(program.note)

    try:
        # TF32 off: values a model computes below float64 even here are then float32's best
        with clock("reference"), _tf32_on_gpu(device, False):
            ref = reference_pass(program, model64, inputs64, keep_float64=options.ablate)
    except Exception as exc:
        cause = exc.cause if isinstance(exc, RunFailed) else exc
        if options.ablate or is_out_of_memory(cause):
            raise UserError(_failure(name, "in float64", device, cause)) from cause
        # A model that will not run in float64 (it builds float32 values of its own that its layers
        # then refuse beside float64 ones): float32 with TF32 off is still 2^13 times finer than the
        # modes measured against it.
        _release(device)
        try:
            with clock("reference"), _tf32_on_gpu(device, False):
                ref = reference_pass(program, model32, inputs32, keep_float64=False)
        except Exception:
            raise UserError(_failure(name, "in float64", device, cause)) from cause
        notes.append(f"the reference ran in float32 (TF32 off): {name} cannot run in float64 ({one_line(cause)})")
        env["reference"]["dtype"] = "float32"
    if not options.ablate:
        model64 = None  # only the one-node-at-a-time runs need it again: its memory is twice the model's

    # issued while the device still computes the reference: its figures are read after
    sens = None
    autocast = _sensitivity_autocast(device, program)
    for attempt in dict.fromkeys((autocast, None)):  # a model that fails under autocast: float32
        try:
            with clock("sensitivity"), _tf32_on_gpu(device, True):
                sens = sensitivity_pass(program, graph, model32, inputs32, attempt)
            autocast = attempt
            break
        except Exception as exc:  # contributions are lost, the rest of the probe is not
            _release(device)
            if attempt is not None:
                continue
            cause = exc.cause if isinstance(exc, RunFailed) else exc
            reason = "out of memory" if is_out_of_memory(cause) else one_line(cause)
            notes.append(f"contributions not measured: the run with gradients failed ({reason})")
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
        notes.append(f"the model computes some values below float64 even in the reference run ({shown}): "
                     "the reference there is as precise as the model makes it")

    from preclint.probe.ledger import ProbeResult

    result = ProbeResult(env, {}, list(ref.order), timings, notes)
    result.reference_nonfinite = reference_nonfinite
    # On a GPU every mode is issued first and read back after: the device never waits for Python in
    # between. The CPU has nothing to overlap: each mode is read back at once, and its copy of the
    # model (rounded weights) is gone before the next one is made.
    pending = []
    maps: Dict[Any, Any] = {}  # between the copies of the model, built once for all modes
    for mode in modes:
        result.modes[mode], state = _issue_mode(mode, program, graph, ref, sens, device, emulated, model32, inputs32,
                                                tolerance, options, clock, maps)
        if device.type == "cuda":
            pending.append((mode, state))
        elif state is not None:
            _finish_mode(result.modes[mode], state, program, graph, ref, device, model64, inputs64, options, clock)
    if sens is not None:
        sens.close()
    for mode, state in pending:
        if state is not None:
            _finish_mode(result.modes[mode], state, program, graph, ref, device, model64, inputs64, options, clock)
    env["modes"] = {mode: measure.how for mode, measure in result.modes.items()}
    how = ""
    if autocast is not None:
        how = f" under {str(autocast).replace('torch.', '')} autocast (the gradients only weight errors)"
    elif device.type == "cuda":
        how = " (TF32 on: the gradients only weight errors)"
    env["contributions"] = "one backward pass per mode through the float32 model" + how
    return result


def _sensitivity_autocast(device, program):
    """On a GPU the backward passes run in bfloat16: half the memory traffic of float32. Only for
    a traced graph: a model recorded eagerly names its values in the order it runs them, and a
    bfloat16 run could take another branch than the reference's and mislabel them."""
    import torch

    return torch.bfloat16 if device.type == "cuda" and program.is_fx else None


def _issue_mode(mode, program, graph, ref, sens, device, emulated, model32, inputs32, tolerance, options, clock, maps):
    """Run the mode's sweep, backward pass and plain run and issue its figures; nothing is read back.
    Returns (measure, what ``_finish_mode`` needs, or None after a failure)."""
    import torch

    from preclint.probe.ledger import ModeMeasure
    from preclint.probe.measure import integer_outputs, output_error, plain_run, queue_figures, sweep
    from preclint.probe.modes import describe_mode, build_mode_run

    measure = ModeMeasure(mode, describe_mode(mode, device, emulated))
    swept = None
    try:
        with clock(f"{mode}: sweep"):
            run = build_mode_run(mode, device, emulated, model32, inputs32, graph, maps)
            measure.how = run.how
            swept = sweep(program, run, ref, graph, keep_errors=sens is not None)
        errors, ref_outputs = output_error(swept.output, ref)
        present = [e for e in errors if e is not None]
        contributions = ([], None)
        if sens is not None and present:
            # ||E|| stays on the device (no stall); finish() drops the contributions if it is 0 or inf
            norm = torch.sqrt(sum(torch.sum(e * e) for e in present))
            with clock(f"{mode}: contributions"), _tf32_on_gpu(device, True):
                contributions = sens.contributions(swept.observer.errors, errors, norm)
        plain = None
        if not run.emulated:
            with clock(f"{mode}: plain run"):
                plain = plain_run(run)
        with clock(f"{mode}: figures"):
            state = queue_figures(swept, contributions, errors, ref_outputs, tolerance,
                                  integer_outputs(swept.output, ref), plain)
        state.errors = errors
        state.ablate = options.ablate and sens is not None
        if not state.ablate:
            swept.observer.errors = {}
        return measure, state
    except Exception as exc:
        _failed(measure, mode, device, exc)
        if swept is not None:
            swept.observer.errors = {}
        return measure, None


def _finish_mode(measure, state, program, graph, ref, device, model64, inputs64, options, clock) -> None:
    """Read the mode's figures back into ``measure`` (and run the ablation, if asked)."""
    from preclint.probe.ablate import ablate
    from preclint.probe.measure import finish

    swept = state.swept
    try:
        with clock(f"{measure.mode}: read back"):
            finish(measure, state, ref, graph)
        if state.ablate:
            with clock(f"{measure.mode}: ablation"):
                ablate(program, graph, ref, model64, inputs64, swept.observer.errors, state.errors, measure)
    except Exception as exc:
        _failed(measure, measure.mode, device, exc)
    finally:
        swept.observer.errors = {}


def _failed(measure, mode, device, exc) -> None:
    from preclint.probe.device import is_out_of_memory
    from preclint.probe.execute import RunFailed

    cause = exc.cause if isinstance(exc, RunFailed) else exc
    if is_out_of_memory(cause):
        measure.error = f"out of memory on {device}"
    elif isinstance(exc, RunFailed):
        measure.error = f"the model failed under {mode} on {device}: {one_line(cause)}"
    else:
        measure.error = f"{one_line(cause)}"
    _release(device)


@contextmanager
def _tf32_on_gpu(device, enabled: bool) -> Iterator[None]:
    """TF32 on or off for the stage, on a GPU (the CPU has no TF32)."""
    from preclint.probe.device import tf32

    if device.type != "cuda":
        yield
        return
    with tf32(enabled):
        yield


def _release(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.empty_cache()


def _move(inputs, device, dtype):
    """The inputs on ``device``; with ``dtype``, floating ones in it (token ids and masks stay)."""
    from preclint.modelio import Inputs
    from preclint.probe.execute import to_device

    def move(v):
        v = to_device(v, device) if v.device != device else v.detach()
        return v.to(dtype) if dtype is not None and v.is_floating_point() else v

    return Inputs.of(inputs).map(move)


def _tensors(value) -> list:
    from preclint.probe.execute import tensors

    return tensors(value)


def _failure(name: str, what: str, device, exc: BaseException) -> str:
    from preclint.probe.device import is_out_of_memory

    if is_out_of_memory(exc):
        return (f"out of memory on {device} while running {name} {what} for the probe's reference; "
                "try a smaller --input-shape, or --probe cpu")
    return f"{name} cannot run {what} on {device}: {one_line(exc)}"


def apply(report, loaded, graph, ctx, config, result, ledger: bool = False) -> None:
    """Put the measurements into ``report``: measured figures and statuses, the findings of the rules
    that judge measurements (Rule.check_probe), notes, environment."""
    from preclint.degenerate import all_outputs_degenerate
    from preclint.findings import Finding
    from preclint.placement import attach_source_locations, relativize
    from preclint.probe.ledger import node_row
    from preclint.probe.verdict import judge, probe_notes, summary_entries
    from preclint.rules import rules_to_run

    degenerate = all_outputs_degenerate(graph)
    judge(report.findings, graph, result, set(result.reference_nonfinite), degenerate)
    if not degenerate:  # shares of rounding residue tell nothing
        flagged = frozenset(f.node for f in report.findings if f.node)
        hot = [finding for rule, rule_ctx in rules_to_run(ctx, config)
               for finding in rule.check_probe(rule_ctx, result, flagged)]
        for finding in hot:
            if finding.location is None:
                finding.location = ctx.model_location
        if loaded is not None:
            attach_source_locations(hot, loaded, graph)
        relativize(hot)
        report.findings = sorted(list(report.findings) + hot, key=Finding.sort_key)
    for mode, entry in summary_entries(result, degenerate).items():
        report.summary.setdefault(mode, {"predicted_output": {"rel_error": None, "max_abs_error": None, "finite": None}})
        report.summary[mode]["measured_output"] = entry
    report.notes = list(report.notes) + probe_notes(result, ctx.display)
    report.environment = result.environment
    if ledger:
        report.ledger = [node_row(graph, ctx, result, n.name) for n in graph.nodes if n.kind != "output"]


def probe_report(loaded, report, graph, ctx, config, options: ProbeOptions):
    """``check --probe`` and ``probe``: measure ``loaded`` and put the results into ``report``."""
    tolerance = None
    if ctx.rtol is not None or ctx.atol is not None:
        tolerance = (ctx.rtol or 0.0, ctx.atol or 0.0)
    from preclint.progress import task

    with task("probe") as bar:
        result = measure_model(loaded.module, loaded.inputs, graph, ctx.modes, options, tolerance, loaded.name, bar)
    apply(report, loaded, graph, ctx, config, result, ledger=options.ledger)
    return result


__all__ = ["ProbeOptions", "measure_model", "apply", "probe_report", "DEVICE_CHOICES"]
