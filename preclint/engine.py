"""Runs the stages in order: capture + reference pass, weights, predictions, rules; sorts Findings.

Later stages read the products of earlier ones and never reach back.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

from preclint.config import Config
from preclint.degenerate import all_outputs_degenerate, degenerate_note, degenerate_outputs
from preclint.errors import UserError
from preclint.findings import Finding
from preclint.ir import Graph
from preclint.numerics import MODES
from preclint.placement import attach_source_locations, display_location, model_location, relativize
from preclint.report import Report
from preclint.rulebase import RuleContext


@dataclass
class CheckOptions:
    modes: Tuple[str, ...]
    run: bool = True
    rtol: Optional[float] = None
    atol: Optional[float] = None
    capture: Optional[str] = None  # force "fx" or "function-mode"


def prepare_inputs(inputs, track: bool):
    """Copies of the example inputs (a tuple, or Inputs with keywords); float ones require grad so
    the backward pass reaches every value."""

    def prep(v):
        v = v.detach().clone()
        if track and v.is_floating_point():
            v.requires_grad_(True)
        return v

    from preclint.modelio import Inputs

    return Inputs.of(inputs).map(prep)


def build_graph(loaded, options: CheckOptions) -> Graph:
    """Capture the model and, unless --no-run, run the reference pass on the CPU."""
    import torch

    from preclint.capture import ModelRunError, capture
    from preclint.modelio import output_notes
    from preclint.progress import task
    from preclint.reference import ReferenceObserver
    from preclint.weights import annotate_weights

    def run(with_gradients: bool):
        observer = ReferenceObserver(with_sensitivity=with_gradients) if options.run else None
        inputs = prepare_inputs(loaded.inputs, track=options.run and with_gradients)
        doing = "reference pass: ops run" if observer else "capturing the graph"
        with torch.set_grad_enabled(with_gradients), task(doing) as bar:
            if observer is not None:
                observer.on_node = bar.advance
            graph, output = capture(loaded.module, inputs, loaded.name, observer, loaded.source_path, options.capture)
            if observer is not None:
                bar.describe("reference pass: gradients" if with_gradients else "reference pass: statistics")
                observer.finish(graph, output)
        return graph, observer, output

    try:
        graph, observer, output = run(with_gradients=True)
    except ModelRunError as exc:
        if not options.run:
            raise UserError(f"{loaded.name} failed on its example inputs ({_describe_inputs(loaded.inputs)}): {exc}") from exc
        # Some models fail only when their values require gradients (a .numpy() call, an in-place
        # write into an input, an op autograd refuses): run them as users run inference, without.
        try:
            graph, observer, output = run(with_gradients=False)
        except ModelRunError:
            raise UserError(f"{loaded.name} failed on its example inputs ({_describe_inputs(loaded.inputs)}): {exc}") from exc
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
    annotate_weights(graph, loaded.module)
    return graph


def _describe_inputs(inputs) -> str:
    from preclint.modelio import Inputs

    return Inputs.of(inputs).describe()


def run_rules(ctx: RuleContext, config: Config) -> List[Finding]:
    from preclint.rules import rules_to_run

    findings: List[Finding] = []
    for rule, rule_ctx in rules_to_run(ctx, config):
        for finding in rule.check_graph(rule_ctx):
            if finding.location is None:
                finding.location = ctx.model_location
            findings.append(finding)
    return findings


def summarize(ctx: RuleContext, degenerate: bool = False) -> Dict[str, Dict]:
    """Per mode, the predicted output error and the layers that hold most of it; ``degenerate``: every
    float output is all zero or rounding residue, and its relative error is not reported (None)."""
    summary: Dict[str, Dict] = {}
    for mode in ctx.modes:
        p = ctx.predictions[mode]
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
    from preclint.predict import relative_errors

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


def check_model(loaded, config: Config, options: CheckOptions) -> Tuple[Report, Graph, RuleContext]:
    from preclint.predict import predict

    for mode in options.modes:
        if mode not in MODES:
            raise UserError(f"unknown precision '{mode}' (known: {', '.join(MODES)})")
    graph = build_graph(loaded, options)
    predictions = predict(graph, options.modes)
    ctx = RuleContext(graph, tuple(options.modes), predictions, options.rtol, options.atol, model_location(loaded))
    findings = run_rules(ctx, config)
    attach_source_locations(findings, loaded, graph)
    relativize(findings)
    notes = list(loaded.notes) + list(graph.notes)
    if not graph.ran_reference:
        notes.append("--no-run: no reference pass; rules used the graph and the weights only, and output errors are not predicted")
    degenerate = degenerate_outputs(graph) if graph.ran_reference else []
    report = Report(
        findings=sorted(findings, key=Finding.sort_key),
        model=loaded.name,
        capture=graph.capture,
        precisions=tuple(options.modes),
        summary=summarize(ctx, degenerate=all_outputs_degenerate(graph, degenerate)),
        notes=notes,
        caveats=[degenerate_note(degenerate, ctx.display)] if degenerate else [],
        tolerance={"rtol": options.rtol, "atol": options.atol} if options.rtol is not None or options.atol is not None else None,
        profile=predicted_profile(ctx) if graph.ran_reference else None,
    )
    return report, graph, ctx
