"""The pipeline: one model's walk (load, place, check, probe, plan), its findings located and
suppressed once, at the end; the command line and the Python API both drive it through ``Session``.

    with Session(Config(precisions=("fp16",)), probe=ProbeOptions(device="cpu")) as session:
        report = session.check("model.py")              # a path the loader resolves
        report = session.check(module, (torch.randn(1, 3, 224, 224),))  # a model already built

The check runs the stages in order: capture + reference pass with the analyses needed, predictions,
rules (``check_graph``). Later stages read the products of earlier ones and never reach back. Only
the analyses whose records the selected rules read (``Rule.needs``), and those of the predicted
errors where the report, the probe or the plan shows them, are computed (``analyses_needed``).
"""
from __future__ import annotations

import contextlib
import inspect
import os
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

from preclint.config import Config
from preclint.reference.degenerate import (all_outputs_degenerate, degenerate_note, degenerate_outputs, drift_note,
                                           mark_drifted, near_zero_note, near_zero_outputs, scale_drift)
from preclint.core.errors import UserError
from preclint.core.findings import Finding
from preclint.capture.heap import long_lived_frozen
from preclint.core.ir import Graph
from preclint.core.notes import Note
from preclint.core.numerics import MODES, SCALED_MODES, scaled_recipes
from preclint.locations.attach import attach_source_locations, model_location, model_name, relativize
from preclint.report import Report
from preclint.report.summary import predicted_profile, scaled_notes, summarize
from preclint.rules.base import RuleContext
from preclint.capture.eager import compiled_code_eager
from preclint.capture.graph import capture
from preclint.capture.model_error import ModelRunError
from preclint.capture.usercode import guard
from preclint.core.launch import launched
from preclint.core.progress import task
from preclint.load.loader import load_model, loaded_from_module
from preclint.load.model_classes import modes_as_stored
from preclint.load.modelio import Inputs, output_notes, tensor_output_paths
from preclint.load.training import for_module
from preclint.predict.error_model import errors_need, predict, PREDICTED_ERRORS_NEED
from preclint.predict.kernel_cases import kernel_cases
from preclint.predict.routing import routing_note
from preclint.reference.analyses import every_analysis, resolve, WeightAnalysis
from preclint.reference.statistics_pass import ReferenceObserver
from preclint.rules import rules_to_run, selected_rules
from preclint.source.command import model_file_source_findings, suppress_graph_findings


@dataclass
class CheckOptions:
    modes: Tuple[str, ...]
    run: bool = True
    rtol: Optional[float] = None
    atol: Optional[float] = None
    capture: Optional[str] = None  # force "fx" or "function-mode"
    # the model's float32 copy on the probe's device (probe/device_copy.py): the reference pass runs
    # there, and the probe measures the same copy; None: on the CPU, on the user's model
    placement: Optional[object] = None
    # compute what the predicted errors read (the summary's output error, the probe's and the plan's
    # comparisons) even where no selected rule reads it; False: only what the selected rules need
    predict_errors: bool = True
    # --train: also check one training step (the loss, backward and optimizer step the model's file gives)
    train: bool = False
    steps: int = 0  # --steps N: with --train and a probe, N steps of each precision beside float32's


def analyses_needed(rules: Iterable[type], also: Iterable[type] = ()) -> list:
    """The analyses (preclint.reference.analyses) that write the records ``rules`` read (``Rule.needs``; None:
    every record) and the records in ``also``, each after those it depends on."""

    records: List[type] = []
    for rule in rules:
        needs = rule.needs if rule.needs is not None else [a.record for a in every_analysis()]
        records += [r for r in needs if r not in records]
    records += [r for r in also if r not in records]
    return resolve(records)


def prepare_inputs(inputs, track: bool):
    """Copies of the example inputs (a tuple, or Inputs with keywords); float ones require grad so
    the backward pass reaches every value."""

    def prep(v):
        v = v.detach().clone()
        if track and v.is_floating_point():
            v.requires_grad_(True)
        return v

    return Inputs.of(inputs).map(prep)


def build_graph(loaded, options: CheckOptions, analyses: Optional[Sequence[type]] = None) -> Graph:
    """Capture the model and, unless --no-run, run the reference pass (on the CPU, or on the
    probe's device with ``options.placement``) with ``analyses`` (every one where None), then the
    analyses of the weights."""
    import torch

    if analyses is None:
        analyses = resolve(a.record for a in every_analysis())
    in_pass = [a() for a in analyses if a.reference_pass]
    placed = options.placement
    module = loaded.module if placed is None else placed.model
    example = loaded.inputs if placed is None else placed.inputs

    def run(with_gradients: bool):
        observer = ReferenceObserver(in_pass, with_sensitivity=with_gradients) if options.run else None
        inputs = prepare_inputs(example, track=options.run and with_gradients)
        doing = "reference pass: ops run" if observer else "capturing the graph"
        with torch.set_grad_enabled(with_gradients), task(doing) as bar:
            if observer is not None:
                observer.on_node = bar.advance
            with observer.saving() if observer is not None else contextlib.nullcontext():
                graph, output = capture(module, inputs, loaded.name, observer, loaded.source_path, options.capture)
            if observer is not None:
                bar.describe("reference pass: gradients" if with_gradients else "reference pass: statistics")
                observer.finish(graph, output)
        return graph, observer, output

    # (gradients only where an analysis reads the backward passes; the capture alone, under --no-run,
    # runs with them as ever)
    gradients = not options.run or any(a.gradients for a in analyses)
    try:
        graph, observer, output = run(with_gradients=gradients)
    except ModelRunError as exc:
        if not options.run or not gradients:
            raise UserError(f"{loaded.name} failed on its example inputs ({_describe_inputs(loaded.inputs)}): {exc}") from exc
        # Some models fail only when their values require gradients (a .numpy() call, an in-place
        # write into an input, an op autograd refuses): run them as users run inference, without.
        try:
            graph, observer, output = run(with_gradients=False)
        except ModelRunError as plain:  # it fails as users run it too: that failure is the one to show
            raise UserError(f"{loaded.name} failed on its example inputs ({_describe_inputs(loaded.inputs)}): {plain}") from plain
        graph.notes.append(Note("reference", f"error propagation estimated without gradients: the model fails when "
                                             f"its values require gradients ({exc})"))
    if inspect.isgenerator(output) or inspect.iscoroutine(output) or inspect.isasyncgen(output):
        if hasattr(output, "close"):
            output.close()  # its body never ran (and a coroutine would warn that it was never awaited)
        raise UserError(f"{loaded.name}: forward returned a {type(output).__name__}, not tensors, so none of its "
                        "code ran; preclint checks a forward that returns its tensors")
    graph.ran_reference = options.run
    if observer is not None:
        graph.first_nonfinite = observer.first_nonfinite
        graph.notes.extend(output_notes(output))
        graph.output_paths = tensor_output_paths(output)
    for analysis in analyses:
        if issubclass(analysis, WeightAnalysis):
            analysis().annotate(graph, loaded.module)
    graph.analyses = tuple(analyses) if options.run else tuple(a for a in analyses if not a.reference_pass)
    return graph


def _describe_inputs(inputs) -> str:
    return Inputs.of(inputs).describe()


def run_rules(ctx: RuleContext, config: Optional[Config]) -> List[Finding]:
    findings: List[Finding] = []
    for rule, rule_ctx in rules_to_run(ctx, config):
        for finding in rule.check_graph(rule_ctx):
            if finding.location is None:
                finding.location = ctx.model_location
            findings.append(finding)
    return findings


def check_graph(loaded, config: Config, options: CheckOptions) -> Tuple[Report, Graph, RuleContext]:
    """Capture, reference pass, predictions, rules: the report of ``loaded``, its findings in the
    order the rules made them and not yet pointed at the source (``locate``)."""

    for mode in options.modes:
        if mode not in MODES:
            raise UserError(f"unknown precision '{mode}' (known: {', '.join(MODES)})")
    # a model stored in bfloat16 or float16 is judged as it runs: its own dtype is the baseline
    modes, stored_notes = modes_as_stored(options.modes, getattr(loaded, "stored", ""), loaded.name)
    options = replace(options, modes=modes)
    rules = selected_rules(options.modes, config)
    graph = build_graph(loaded, options, analyses_needed(rules, errors_need(options.modes) if options.predict_errors else ()))
    predictions = predict(graph, options.modes)
    ctx = RuleContext(graph, tuple(options.modes), predictions, options.rtol, options.atol, model_location(loaded),
                      model_name=model_name(loaded))
    training_notes = _predict_training(loaded, ctx, options) if options.train else []
    findings = run_rules(ctx, config)
    notes = stored_notes + list(loaded.notes) + list(graph.notes) + scaled_notes(graph, options.modes) + training_notes
    # (under --no-run the summary is what it always was: figures from the graph alone, with a note)
    errors_predicted = graph.computed(PREDICTED_ERRORS_NEED) or not graph.ran_reference
    if not graph.ran_reference:
        notes.append(Note("reference", "--no-run: no reference pass; rules used the graph and the weights only, and "
                                       "output errors are not predicted"))
    elif not errors_predicted:
        notes.append(Note("prediction", "the selected rules read no error estimate, so the statistics it needs were not "
                                        "computed and output errors are not predicted (check without --select, or "
                                        "with --probe, for them)"))
    degenerate = degenerate_outputs(graph) if graph.ran_reference else []
    drift = scale_drift(graph)
    # said once: a drift over the network already explains outputs near zero
    near_zero = near_zero_outputs(graph) if drift is None else []
    mark_drifted(findings, graph, drift, {kind: {rule.code for rule in rules if rule.size_drift == kind}
                                          for kind in ("vanishing", "exploding")})
    # the mode whose dot products round as the backend's kernel choices say (tf32), if one was asked for
    kernel_bound = next((p for p in predictions.values() if p.mode.kernel_choice_matters), None)
    cases = kernel_cases(graph, kernel_bound) if kernel_bound is not None and errors_predicted else None
    assumed = cases.note(kernel_bound) if cases is not None else None
    if assumed:
        notes.append(Note("prediction", assumed))
    routes = routing_note(graph, predictions, ctx.display) if graph.ran_reference and errors_predicted else None
    if routes:
        notes.append(Note("prediction", routes))
    report = Report(
        findings=findings,
        model=loaded.name,
        capture=graph.capture,
        precisions=tuple(options.modes),
        summary=summarize(ctx, degenerate=all_outputs_degenerate(graph, degenerate), predicted=errors_predicted,
                          cases=cases),
        notes=notes,
        caveats=([degenerate_note(degenerate, ctx.display)] if degenerate else []) + ([drift_note(drift, ctx.display)] if drift else [])
        + ([near_zero_note(near_zero, ctx.display)] if near_zero else []),
        tolerance={"rtol": options.rtol, "atol": options.atol} if options.rtol is not None or options.atol is not None else None,
        profile=predicted_profile(ctx) if graph.ran_reference and errors_predicted else None,
    )
    for mode, figures in ctx.training.items():
        entry = report.summary.setdefault(mode, {"predicted_output": {"rel_error": None, "max_abs_error": None,
                                                                      "finite": None}})
        entry["training"] = {"predicted": figures.as_dict()}
    return report, graph, ctx


def _predict_training(loaded, ctx: RuleContext, options: CheckOptions) -> List[Note]:
    """The training step's predicted figures, into ``ctx`` (the rules and the probe read them); the notes."""
    from preclint.predict.training import predict_step  # lazy: the plain check loads no probe/measure/plan

    if getattr(loaded, "training", None) is None:
        raise UserError(f"{loaded.name}: --train needs the training step: give loss_fn and example_targets (or a "
                        "model that returns its loss) and make_optimizer(params) in the file")
    forward = {mode: p.rel_error for mode, p in ctx.predictions.items()}
    ctx.training_reference, ctx.training, notes = predict_step(loaded, options.modes, forward)
    return notes


def locate(report: Report, loaded, graph: Graph) -> None:
    """Point every finding of ``report`` at the source (the lines that made its op, paths as reports
    print them), and sort them as reports list them."""
    attach_source_locations(report.findings, loaded, graph)
    relativize(report.findings)
    report.findings = sorted(report.findings, key=Finding.sort_key)


@long_lived_frozen()
def check_model(loaded, config: Config, options: CheckOptions) -> Tuple[Report, Graph, RuleContext]:
    """The check alone (no probe, no suppression), its findings located: ``check_graph``, then ``locate``."""
    report, graph, ctx = check_graph(loaded, config, options)
    locate(report, loaded, graph)
    return report, graph, ctx


@dataclass(frozen=True)
class LoadOptions:
    """How a path becomes a model and its example inputs (preclint.load.loader.load_model)."""

    model: Optional[str] = None  # the class, factory or instance in the file (--model)
    inputs: Optional[Sequence[str]] = None  # --input specifications
    input_shapes: Optional[Sequence[Any]] = None  # --input-shape
    input_dtype: str = "float32"
    weights: Optional[str] = None  # a state dict, loaded with weights_only=True
    seed: int = 0
    train: bool = False  # the file also gives a training step (--train; load/training.py)

    def load(self, path: str):
        return load_model(path, model=self.model, input_shapes=self.input_shapes, input_dtype=self.input_dtype,
                          weights=self.weights, seed=self.seed, inputs=self.inputs, train=self.train)


@dataclass(frozen=True)
class PlanOptions:
    """How `plan` makes its plan (preclint.plan.command.build_plan): verified by runs on ``device``
    or only predicted; chosen, or the keep list of the policy in ``policy_file``."""

    verify: bool = True
    device: str = "auto"
    policy_file: Optional[str] = None
    backend: str = "eager"  # also verify the plan compiled (measure/compiled.py) and audit its kept layers
    formats: Tuple[str, ...] = ()  # --formats: a format per layer from these, cheapest first (plan/formats.py)


class Session:
    """One model's walk at a time: load (a path), or take a model already built; place it on the
    probe's device; check; probe; plan; its findings located and suppressed once, at the end.

    ``config``: rule selection, precisions, tolerance, time limit, per-file ignores ([tool.preclint]
    with the flags applied); ``load``: how a path becomes a model; ``check``: the check's options
    (from ``config`` where None); ``probe``: the probe's options (None: no probe); ``plan``: the
    plan's options, checked at once against the precision and the tolerance; ``warn``: where the
    warnings the model's code raised go as they happen (the command line prints them with --debug).

    Who measures is the probe's strategy (probe/distributed.py): this process, or, under torchrun,
    the ranks, joined when the session is entered (``with Session(...)``) and left at its exit.
    """

    def __init__(self, config: Config, *, load: Optional[LoadOptions] = None, check: Optional[CheckOptions] = None,
                 probe=None, plan: Optional[PlanOptions] = None, warn: Optional[Callable[[str], None]] = None,
                 training=None) -> None:
        self.config = config
        self.load = load if load is not None else LoadOptions()
        self.options = check if check is not None else CheckOptions(modes=tuple(config.precisions), rtol=config.rtol,
                                                                    atol=config.atol)
        self.probe = probe  # preclint.probe.ProbeOptions, or None
        self.plan_options = plan
        self.warn = warn
        self.training = training  # a built model's training step (load/training.py TrainingStep), for --train
        # the probe's strategy (probe/distributed.py) once the session is entered with a probe; None:
        # this process alone, which is all a check without a probe imports
        self._strategy = None
        self._source_files: set = set()  # model files the source rules checked (real paths)
        if plan is not None:
            self._plan_request()  # mistakes in the plan's settings, found before any model loads

    @property
    def distributed(self) -> bool:
        """Whether torchrun started this process among others."""

        return launched()

    @property
    def reports_here(self) -> bool:
        """Whether this process writes the report (under torchrun only rank 0 does)."""
        return self._strategy is None or self._strategy.reports

    def __enter__(self) -> "Session":
        if self.probe is not None:
            from preclint.probe.distributed import strategy  # lazy: the plain check loads no probe/measure/plan

            self._strategy = strategy(self.probe.device, self.config.timeout)
        return self

    def __exit__(self, *exc_info) -> None:
        strategy, self._strategy = self._strategy, None
        if strategy is not None:
            strategy.leave()

    def check(self, target, inputs=None) -> Optional[Report]:
        """The report of one model: a path the loader resolves, or an nn.Module called on ``inputs``
        (a tensor, a tuple of positional inputs, a dict of keyword inputs, or load.modelio.Inputs).
        Raises UserError where the model cannot be checked; None on a rank that only measures."""
        return self._walk(target, inputs, None)

    def check_each(self, targets: Iterable[str], on_error: Callable[[Exception], str]) -> List[Report]:
        """One report per path, in order. A model that cannot be checked gets a report with its error
        (``on_error(exc)``, which tells the user at once and returns the error as the report states
        it), so the other models are still reported. None at all on a rank that only measures."""
        reports = [self._walk(target, None, on_error) for target in targets]
        return [report for report in reports if report is not None]

    def plan(self, target, inputs=None):
        """(the check's report, the plan) of one model (a path, or an nn.Module and its ``inputs``):
        the fewest units to keep in float32 that meet the tolerance under the session's one
        precision, verified unless the plan's options say not to."""
        from preclint.plan.command import build_plan  # lazy: the plain check loads no probe/measure/plan
        from preclint.plan.default_atol import with_default_atol  # lazy: the plain check loads no probe/measure/plan

        mode, tolerance = self._plan_request()
        settings = self.plan_options or PlanOptions()
        with guard(_name_of(target), self.config.timeout), self._model(target, inputs) as loaded:
            report, graph, _ = check_model(loaded, self.config, self.options)
            if settings.formats or MODES[mode].recipe is not None:  # scaled formats: plan/scaled.py, plan/formats.py
                from preclint.plan.formats import scaled_plan  # lazy: the plain check loads no probe/measure/plan

                return report, scaled_plan(loaded, graph, mode, tolerance.rtol, settings)
            tolerance, atol_note = with_default_atol(graph, tolerance)
            plan = build_plan(loaded, graph, report.findings, mode, tolerance, verify=settings.verify,
                              device=settings.device, policy_file=settings.policy_file, backend=settings.backend)
        if atol_note:
            plan.notes.insert(0, atol_note)
        return report, plan

    def _plan_request(self):
        """(precision, tolerance) of the plan: one precision a plan can reduce to, and a tolerance."""
        from preclint.measure.compare import Tolerance  # lazy: the plain check loads no probe/measure/plan
        from preclint.plan.planner import PLAN_MODES  # lazy: the plain check loads no probe/measure/plan

        if self.plan_options is not None and self.plan_options.formats:  # a format per layer (plan/formats.py)
            if self.config.rtol is None:
                raise UserError("a plan with --formats needs --rtol: the output's relative RMS error to meet")
            return None, Tolerance(self.config.rtol, None, None)
        modes = self.options.modes
        if len(modes) != 1 or modes[0] not in PLAN_MODES + SCALED_MODES:
            raise UserError(f"plan takes one --precision: {', '.join(PLAN_MODES + SCALED_MODES)}")
        tolerance = Tolerance(self.config.rtol, self.config.atol, self.config.max_flip)
        if modes[0] in SCALED_MODES and self.config.rtol is None:
            raise UserError(f"a plan for {modes[0]} needs --rtol: the output's relative RMS error to meet")
        if not tolerance.compares_values and tolerance.max_flip is None:
            raise UserError("plan needs the tolerance to meet: --rtol/--atol (or rtol/atol in [tool.preclint]), "
                            "or a decision budget --max-flip (or max-flip in [tool.preclint])")
        return modes[0], tolerance

    def _walk(self, target, inputs, on_error: Optional[Callable[[Exception], str]]) -> Optional[Report]:
        if not self.reports_here:
            self._measure_share(target, inputs)
            return None
        name = _name_of(target)
        guarded = None
        part = None
        if self.probe is not None:
            from preclint.probe import place_for_probe  # lazy: the plain check loads no probe/measure/plan
            from preclint.probe.distributed import OneProcess  # lazy: the plain check loads no probe/measure/plan

            # this model's part of the measurements: under torchrun, the other ranks' (gathered once)
            part = (self._strategy or OneProcess()).model(self.options.modes)
        try:
            with guard(name, self.config.timeout) as guarded, self._model(target, inputs) as loaded:
                placement = place_for_probe(loaded, self.probe) if self.probe is not None else None
                report, graph, ctx, placement, unplaced = self._check_placed(loaded, placement)
                if self.probe is not None:
                    self._probe(loaded, report, ctx, placement, part, unplaced)
                elif self.config.output_format == "html":  # the page's header records where the predictions ran
                    from preclint.probe.device import check_environment  # lazy: the plain check loads no probe/measure/plan

                    report.environment = check_environment()
        except Exception as exc:  # UserError: a mistake or a model that fails; anything else: a bug in preclint
            if on_error is None:
                raise
            return Report(model=name, precisions=tuple(self.config.precisions), error=on_error(exc))
        finally:
            if part is not None:
                part.close()  # the other ranks wait for it even where this model could not be checked
            if guarded is not None and self.warn is not None:
                for warning in guarded.warnings:
                    self.warn(warning)
        report.notes.extend(Note("warning", f"warning at {warning}") for warning in guarded.user_warnings)
        locate(report, loaded, graph)
        files = [target] if isinstance(target, str) else [loaded.source_path] if loaded.source_path else []
        # the model's file gets the source rules too, as --source-only checks it (once a session)
        source_findings, source_codes = self._model_file_findings(target)
        report.findings = sorted(suppress_graph_findings(report.findings + source_findings, self.config, files,
                                                         also_checked=source_codes), key=Finding.sort_key)
        return report

    def _model_file_findings(self, target) -> Tuple[List[Finding], List[str]]:
        """The source rules' findings on the file a path names (``model.py``, ``model.py:Net``),
        and the codes that ran; nothing for a module path, a built module, or a file checked
        before in this session (two models of one file report its source findings once)."""

        filename = _model_file(target)
        if filename is None or os.path.realpath(filename) in self._source_files:
            return [], []
        self._source_files.add(os.path.realpath(filename))
        return model_file_source_findings(filename, self.config)

    def _measure_share(self, target, inputs) -> None:
        """A rank other than 0: measure its share of the modes of one model and send them to rank 0,
        which reports any failure (and measures those modes itself)."""
        from preclint.probe import place_for_probe, probed, tolerance_of  # lazy: the plain check loads no probe/measure/plan

        part = self._strategy.model(self.options.modes)
        try:
            with guard(_name_of(target), self.config.timeout), self._model(target, inputs) as loaded:
                module, example = probed(loaded, place_for_probe(loaded, self.probe))
                part.measure(module, example, None, self.options.modes, self.probe,
                             tolerance_of(self.options.rtol, self.options.atol), name=loaded.name)
        except Exception as exc:  # noqa: BLE001 - rank 0 says what failed, once
            part.failed(exc)
        finally:
            part.close()

    def _check_placed(self, loaded, placement):
        """The check with its reference pass on the probe's device; where that runs out of memory
        (the pass keeps gradients too), or the model cannot run there (it makes a tensor of another
        device in its forward), on the CPU, as without a GPU. Also why the probe cannot run, or None."""
        try:
            return (*self._check(loaded, placement), placement, None)
        except Exception as exc:
            from preclint.probe.device import device_mismatch, is_out_of_memory  # lazy: the plain check loads no probe/measure/plan

            if placement is None:
                raise
            mismatch = device_mismatch(exc)
            if mismatch is None and not any(is_out_of_memory(e) for e in (exc, exc.__cause__, exc.__context__) if e):
                raise
        import torch

        device = placement.device
        if device.type == "cuda":
            torch.cuda.empty_cache()
        report, graph, ctx = self._check(loaded, None)
        if mismatch is not None:
            return report, graph, ctx, None, _unplaced_note(device, mismatch)
        report.notes = list(report.notes) + [Note("reference", "the reference statistics were computed on the CPU: "
                                                               f"{device} ran out of memory")]
        return report, graph, ctx, None, None

    def _probe(self, loaded, report, ctx, placement, part, unplaced: Optional[Note]) -> None:
        """The probe's measurements merged into ``report``; where the model cannot run on the probe's
        device, one note that says why, and the check's findings and predictions as they are."""
        from preclint.probe import probe_report  # lazy: the plain check loads no probe/measure/plan
        from preclint.probe.device import device_mismatch, select_device  # lazy: the plain check loads no probe/measure/plan

        if unplaced is None:
            try:
                probe_report(loaded, report, ctx, self.config, self.probe, placement=placement, measurer=part)
                if ctx.training_reference is not None:  # --train: each precision's step, measured
                    from preclint.probe.training import measure_training_into  # lazy: the plain check loads no probe/measure/plan

                    measure_training_into(report, loaded, ctx, self.probe.device, steps=self.options.steps)
                return
            except Exception as exc:
                mismatch = device_mismatch(exc)
                if mismatch is None:
                    raise
                unplaced = _unplaced_note(placement.device if placement is not None else select_device(self.probe.device),
                                          mismatch)
        report.notes = list(report.notes) + [unplaced]

    @long_lived_frozen()
    def _check(self, loaded, placement) -> Tuple[Report, Graph, RuleContext]:
        with compiled_code_eager():
            return check_graph(loaded, self.config, replace(self.options, placement=placement))

    @contextlib.contextmanager
    def _model(self, target, inputs) -> Iterator[Any]:
        """The LoadedModel of ``target``: a path loaded, or an nn.Module with ``inputs``, in eval mode
        while the session works on it and given back in the mode it came in."""

        if isinstance(target, str):
            if inputs is not None:
                raise UserError(f"{target}: a path's inputs come from the file or from --input, not from the call")
            with scaled_recipes(self.config.scaling):
                yield self.load.load(target)
            return

        loaded = loaded_from_module(target, inputs)
        loaded.training = None if self.training is None else for_module(self.training, loaded.module)
        with _in_eval_mode(loaded.module), scaled_recipes(self.config.scaling):
            yield loaded


def _unplaced_note(device, reason: str) -> Note:
    if "backend" in reason:  # an op with no kernel there: int8 quantized layers on a GPU
        why = "an op it runs has no kernel there"
        fix = "`--probe cpu` measures it where its ops run"
    else:
        why = ("it makes or holds a tensor on another device in its forward (a torch.tensor(..., device=...) or "
               ".to(...) of its own)")
        fix = "`--probe cpu` measures it there, or make the tensor on the input's device (x.device)"
    return Note("probe", f"probe: not run: the model cannot run on {device} ({reason}); {why}. The check above ran on "
                         f"the CPU; {fix}")


def _model_file(target) -> Optional[str]:
    """The Python file a path names, with or without ``:attr``; None for a module path or a module."""
    if not isinstance(target, str):
        return None
    for candidate in (target, target.rsplit(":", 1)[0]):
        if candidate.endswith(".py") and os.path.isfile(candidate):
            return candidate
    return None


def _name_of(target) -> str:
    return target if isinstance(target, str) else type(target).__name__


@contextlib.contextmanager
def _in_eval_mode(module) -> Iterator[None]:
    """``module`` in eval mode (inference is what is checked), each submodule's mode restored after."""
    training = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        yield
    finally:
        for m, mode in training:
            m.training = mode
