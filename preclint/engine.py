"""Runs the stages in order: capture + reference pass with the analyses needed, predictions, rules;
sorts Findings.

Later stages read the products of earlier ones and never reach back. Only the analyses whose records
the selected rules read (``Rule.needs``), and those of the predicted errors where the report, the probe
or the plan shows them, are computed (``analyses_needed``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from preclint.config import Config
from preclint.reference.degenerate import all_outputs_degenerate, degenerate_note, degenerate_outputs
from preclint.core.errors import UserError
from preclint.core.findings import Finding
from preclint.capture.heap import long_lived_frozen
from preclint.core.ir import Graph
from preclint.core.numerics import MODES
from preclint.locations.attach import attach_source_locations, display_location, model_location, relativize
from preclint.report import Report
from preclint.rules.base import RuleContext


@dataclass
class CheckOptions:
    modes: Tuple[str, ...]
    run: bool = True
    rtol: Optional[float] = None
    atol: Optional[float] = None
    capture: Optional[str] = None  # force "fx" or "function-mode"
    # the model's float32 copy on the probe's device (probe/placement.py): the reference pass runs
    # there, and the probe measures the same copy; None: on the CPU, on the user's model
    placement: Optional[object] = None
    # compute what the predicted errors read (the summary's output error, the probe's and the plan's
    # comparisons) even where no selected rule reads it; False: only what the selected rules need
    predict_errors: bool = True


def analyses_needed(rules: Iterable[type], also: Iterable[type] = ()) -> list:
    """The analyses (preclint.reference.analyses) that write the records ``rules`` read (``Rule.needs``; None:
    every record) and the records in ``also``, each after those it depends on."""
    from preclint.reference.analyses import every_analysis, resolve

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

    from preclint.load.modelio import Inputs

    return Inputs.of(inputs).map(prep)


def build_graph(loaded, options: CheckOptions, analyses: Optional[Sequence[type]] = None) -> Graph:
    """Capture the model and, unless --no-run, run the reference pass (on the CPU, or on the
    probe's device with ``options.placement``) with ``analyses`` (every one where None), then the
    analyses of the weights."""
    import torch

    from preclint.reference.analyses import WeightAnalysis, every_analysis, resolve
    from preclint.capture.graph import capture
    from preclint.capture.model_error import ModelRunError
    from preclint.load.modelio import output_notes
    from preclint.core.progress import task
    from preclint.reference.statistics_pass import ReferenceObserver

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
        graph.notes.append(f"error propagation estimated without gradients: the model fails when its values require "
                           f"gradients ({exc})")
    if inspect.isgenerator(output) or inspect.iscoroutine(output) or inspect.isasyncgen(output):
        if hasattr(output, "close"):
            output.close()  # its body never ran (and a coroutine would warn that it was never awaited)
        raise UserError(f"{loaded.name}: forward returned a {type(output).__name__}, not tensors, so none of its "
                        "code ran; preclint checks a forward that returns its tensors")
    graph.ran_reference = options.run
    if observer is not None:
        graph.first_nonfinite = observer.first_nonfinite
        graph.notes.extend(output_notes(output))
    for analysis in analyses:
        if issubclass(analysis, WeightAnalysis):
            analysis().annotate(graph, loaded.module)
    graph.analyses = tuple(analyses) if options.run else tuple(a for a in analyses if not a.reference_pass)
    return graph


def _describe_inputs(inputs) -> str:
    from preclint.load.modelio import Inputs

    return Inputs.of(inputs).describe()


def run_rules(ctx: RuleContext, config: Optional[Config]) -> List[Finding]:
    from preclint.rules import rules_to_run

    findings: List[Finding] = []
    for rule, rule_ctx in rules_to_run(ctx, config):
        for finding in rule.check_graph(rule_ctx):
            if finding.location is None:
                finding.location = ctx.model_location
            findings.append(finding)
    return findings


def summarize(ctx: RuleContext, degenerate: bool = False, predicted: bool = True) -> Dict[str, Dict]:
    """Per mode, the predicted output error and the layers that hold most of it; ``degenerate``: every
    float output is all zero or rounding residue, and its relative error is not reported (None);
    ``predicted``: False where the statistics the error estimate needs were not computed (no figures)."""
    summary: Dict[str, Dict] = {}
    for mode in ctx.modes:
        p = ctx.predictions[mode]
        if not predicted:
            summary[mode] = {"predicted_output": {"rel_error": None, "max_abs_error": None, "finite": None}, "top_layers": []}
            continue
        summary[mode] = {
            "predicted_output": {
                "rel_error": None if degenerate else p.rel_error,
                "max_abs_error": p.max_abs_error,
                "finite": p.finite if ctx.graph.ran_reference else None,
            },
            "top_layers": [
                {"module": ctx.display(name), "node": name, "share": round(share, 4)}
                for name, share in p.top_contributors(5)
            ],
        }
    return summary


def predicted_profile(ctx: RuleContext) -> List[Dict]:
    """Every node's predicted errors in execution order (the picture of the whole model the HTML
    report draws): local and received relative RMS error and share of the output error, per mode."""
    from preclint.predict.error_model import relative_errors

    received = {mode: relative_errors(ctx.graph, ctx.predictions[mode]) for mode in ctx.modes}
    rows = []
    for node in ctx.graph.nodes:
        if node.kind == "output":
            continue
        rms = node.out.rms if node.out is not None else 0.0
        modes = {}
        for mode in ctx.modes:
            p = ctx.predictions[mode]
            local = p.nodes[node.name].local
            modes[mode] = {"local": local / rms if rms > 0 else None, "received": received[mode].get(node.name),
                           "share": p.contributions.get(node.name)}
        rows.append({"node": node.name, "module": node.module_path, "op": node.target, "kind": node.kind,
                     "location": display_location(node.location).as_dict() if node.location else None,
                     "modes": modes})
    return rows


@long_lived_frozen()
def check_model(loaded, config: Config, options: CheckOptions) -> Tuple[Report, Graph, RuleContext]:
    from preclint.predict.error_model import PREDICTED_ERRORS_NEED, predict
    from preclint.rules import selected_rules

    for mode in options.modes:
        if mode not in MODES:
            raise UserError(f"unknown precision '{mode}' (known: {', '.join(MODES)})")
    rules = selected_rules(options.modes, config)
    graph = build_graph(loaded, options, analyses_needed(rules, PREDICTED_ERRORS_NEED if options.predict_errors else ()))
    predictions = predict(graph, options.modes)
    ctx = RuleContext(graph, tuple(options.modes), predictions, options.rtol, options.atol, model_location(loaded))
    findings = run_rules(ctx, config)
    attach_source_locations(findings, loaded, graph)
    relativize(findings)
    notes = list(loaded.notes) + list(graph.notes)
    # (under --no-run the summary is what it always was: figures from the graph alone, with a note)
    errors_predicted = graph.computed(PREDICTED_ERRORS_NEED) or not graph.ran_reference
    if not graph.ran_reference:
        notes.append("--no-run: no reference pass; rules used the graph and the weights only, and output errors are not predicted")
    elif not errors_predicted:
        notes.append("the selected rules read no error estimate, so the statistics it needs were not computed and "
                     "output errors are not predicted (check without --select, or with --probe, for them)")
    degenerate = degenerate_outputs(graph) if graph.ran_reference else []
    report = Report(
        findings=sorted(findings, key=Finding.sort_key),
        model=loaded.name,
        capture=graph.capture,
        precisions=tuple(options.modes),
        summary=summarize(ctx, degenerate=all_outputs_degenerate(graph, degenerate), predicted=errors_predicted),
        notes=notes,
        caveats=[degenerate_note(degenerate, ctx.display)] if degenerate else [],
        tolerance={"rtol": options.rtol, "atol": options.atol} if options.rtol is not None or options.atol is not None else None,
        profile=predicted_profile(ctx) if graph.ran_reference and errors_predicted else None,
    )
    return report, graph, ctx
