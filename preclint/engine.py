"""Runs the stages in order: capture + reference pass, weights, predictions, rules; sorts Findings.

Later stages read the products of earlier ones and never reach back.
"""
from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from preclint.config import Config
from preclint.errors import UserError
from preclint.findings import ErrorFigure, Finding, Location
from preclint.ir import Graph, Node
from preclint.numerics import MODES
from preclint.predict import ModePrediction
from preclint.report import Report


@dataclass
class Context:
    """What a rule sees: the graph, the predictions per mode, and the options of this run."""

    graph: Graph
    modes: Tuple[str, ...]
    predictions: Dict[str, ModePrediction]
    rtol: Optional[float] = None
    atol: Optional[float] = None
    model_location: Optional[Location] = None

    def node_figure(self, node: Node, mode: str) -> ErrorFigure:
        """The node's own (local) predicted error under ``mode``: relative to its RMS, and max-abs."""
        from preclint.numerics import gaussian_max_factor

        local = self.predictions[mode].nodes[node.name].local
        out = node.out
        if out is None or out.rms == 0:
            return ErrorFigure(None, None)
        return ErrorFigure(local / out.rms, local * gaussian_max_factor(out.numel))

    def output_figure(self, mode: str) -> ErrorFigure:
        p = self.predictions[mode]
        return ErrorFigure(p.rel_error, p.max_abs_error)

    def display(self, name: str) -> str:
        """A node as users know it: its module path, else its op and the module that calls it."""
        node = self.graph.get(name)
        if node is None:
            return name
        if node.module_path and node.target.startswith("nn."):
            return node.module_path
        # an op of the root module's own forward is named with the root's class
        where = f" in {node.module_path}" if node.module_path else (f" in {node.module_type}" if node.module_type else "")
        return f"{node.target}{where}" if node.kind != "input" else f"the input {name}"


@dataclass
class CheckOptions:
    modes: Tuple[str, ...]
    run: bool = True
    rtol: Optional[float] = None
    atol: Optional[float] = None
    capture: Optional[str] = None  # force "fx" or "function-mode"


def prepare_inputs(inputs: tuple, track: bool) -> tuple:
    """Copies of the example inputs; float ones require grad so the backward pass reaches every value."""
    import torch
    from torch.utils._pytree import tree_map

    def prep(v):
        if isinstance(v, torch.Tensor):
            v = v.detach().clone()
            if track and v.is_floating_point():
                v.requires_grad_(True)
        return v

    return tuple(tree_map(prep, list(inputs)))


def build_graph(loaded, options: CheckOptions) -> Graph:
    """Capture the model and, unless --no-run, run the reference pass on the CPU."""
    import torch

    from preclint.capture import ModelRunError, capture
    from preclint.reference import ReferenceObserver
    from preclint.weights import annotate_weights

    def run(with_gradients: bool):
        observer = ReferenceObserver(with_sensitivity=with_gradients) if options.run else None
        inputs = prepare_inputs(loaded.inputs, track=options.run and with_gradients)
        with torch.set_grad_enabled(with_gradients):
            graph, output = capture(loaded.module, inputs, loaded.name, observer, loaded.source_path, options.capture)
            if observer is not None:
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
    graph.ran_reference = options.run
    if observer is not None:
        graph.first_nonfinite = observer.first_nonfinite
    annotate_weights(graph, loaded.module)
    return graph


def _describe_inputs(inputs) -> str:
    import torch

    def one(v):
        if isinstance(v, torch.Tensor):
            return "x".join(str(d) for d in v.shape) + f" {str(v.dtype).replace('torch.', '')}"
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(one(x) for x in v) + "]"
        return type(v).__name__

    return ", ".join(one(v) for v in inputs) or "no inputs"


def model_location(loaded) -> Optional[Location]:
    """Where the model is defined, for findings that have no line of their own."""
    path = loaded.source_path
    if not path:
        return None
    line = 1
    try:
        cls_file = inspect.getsourcefile(type(loaded.module))
        if cls_file and os.path.abspath(cls_file) == os.path.abspath(path):
            line = inspect.getsourcelines(type(loaded.module))[1]
    except (OSError, TypeError):
        pass
    return Location(path, line, 1)


def run_rules(ctx: Context, config: Config) -> List[Finding]:
    from preclint.rules import graph_rules

    findings: List[Finding] = []
    for rule_cls in graph_rules():
        if not config.is_selected(rule_cls.code):
            continue
        for finding in rule_cls().check_graph(ctx):
            if finding.location is None:
                finding.location = ctx.model_location
            findings.append(finding)
    return findings


def relative_path(path: str) -> str:
    try:
        rel = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return path
    return rel


def relativize(findings: Sequence[Finding]) -> None:
    for f in findings:
        if f.location is not None:
            f.location = Location(relative_path(f.location.path), f.location.line, f.location.column)
        f.related = tuple((Location(relative_path(loc.path), loc.line, loc.column), text) for loc, text in f.related)


def summarize(ctx: Context) -> Dict[str, Dict]:
    summary: Dict[str, Dict] = {}
    for mode in ctx.modes:
        p = ctx.predictions[mode]
        summary[mode] = {
            "predicted_output": {
                "rel_error": p.rel_error,
                "max_abs_error": p.max_abs_error,
                "finite": p.finite if ctx.graph.ran_reference else None,
            },
            "top_layers": [
                {"module": ctx.display(name), "node": name, "share": round(share, 4)}
                for name, share in p.top_contributors(5)
            ],
        }
    return summary


def check_model(loaded, config: Config, options: CheckOptions) -> Tuple[Report, Graph, Context]:
    from preclint.predict import predict

    for mode in options.modes:
        if mode not in MODES:
            raise UserError(f"unknown precision '{mode}' (known: {', '.join(MODES)})")
    graph = build_graph(loaded, options)
    predictions = predict(graph, options.modes)
    ctx = Context(graph, tuple(options.modes), predictions, options.rtol, options.atol, model_location(loaded))
    findings = run_rules(ctx, config)
    attach_source_locations(findings, loaded)
    relativize(findings)
    notes = list(graph.notes)
    if not graph.ran_reference:
        notes.append("--no-run: no reference pass; rules used the graph and the weights only, and output errors are not predicted")
    report = Report(
        findings=sorted(findings, key=Finding.sort_key),
        model=loaded.name,
        capture=graph.capture,
        precisions=tuple(options.modes),
        summary=summarize(ctx),
        notes=notes,
        tolerance={"rtol": options.rtol, "atol": options.atol} if options.rtol is not None or options.atol is not None else None,
    )
    return report, graph, ctx


def module_definition_locations(root, paths) -> Dict[str, Location]:
    """module path -> the line in the user's code that builds that module.

    A module is built by the nearest enclosing module whose class the user wrote (torchvision's and
    torch's own classes are not the user's code): ``stages.0.depthwise`` is built by the class of
    ``stages.0`` as its ``depthwise`` attribute; a block inside an ``nn.Sequential`` by the class that
    builds the Sequential.
    """
    from preclint.capture import is_internal_file
    from preclint.source.locations import definition_location

    modules = dict(root.named_modules())
    files: Dict[str, Optional[str]] = {}

    def user_file(path: str) -> Optional[str]:
        if path not in files:
            try:
                source = inspect.getsourcefile(type(modules[path]))
            except (TypeError, OSError):
                source = None
            files[path] = source if source and not is_internal_file(source) else None
        return files[path]

    found: Dict[str, Location] = {}
    for path in paths:
        if path not in modules or not path:
            continue
        parts = path.split(".")
        for cut in range(len(parts) - 1, -1, -1):
            owner = ".".join(parts[:cut])
            source = user_file(owner)
            if source is None:
                continue
            where = definition_location(source, type(modules[owner]).__name__, ".".join(parts[cut:]))
            if where is not None:
                found[path] = where
            break
    return found


def attach_source_locations(findings: List[Finding], loaded) -> None:
    """Point each finding at the line that builds its module as well as the line that calls it.

    A finding inside library code (no user frame in its stack) moves to the line that builds its
    module, or stays at the model's definition.
    """
    modules = {f.module for f in findings if f.module}
    if not modules:  # nothing to place: don't pay for parsing (or importing libcst)
        return
    definitions = module_definition_locations(loaded.module, modules)
    fallback = model_location(loaded)
    for f in findings:
        where = definitions.get(f.module)
        if where is None:
            continue
        if f.location is None or f.location == fallback:
            f.location = where
        elif (where.path, where.line) != (os.path.relpath(f.location.path), f.location.line):
            f.related = f.related + ((where, f"{f.module} is built here"),)
