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
from preclint.findings import ErrorFigure, Finding, Location, sci
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
    # the model's float32 copy on the probe's device (probe/placement.py): the reference pass runs
    # there, and the probe measures the same copy; None: on the CPU, on the user's model
    placement: Optional[object] = None


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
    """Capture the model and, unless --no-run, run the reference pass (on the CPU, or on the
    probe's device with ``options.placement``)."""
    import torch

    from preclint.capture import ModelRunError, capture
    from preclint.modelio import output_notes
    from preclint.reference import ReferenceObserver
    from preclint.weights import annotate_weights

    placed = options.placement
    module = loaded.module if placed is None else placed.model
    example = loaded.inputs if placed is None else placed.inputs

    def run(with_gradients: bool):
        observer = ReferenceObserver(with_sensitivity=with_gradients) if options.run else None
        inputs = prepare_inputs(example, track=options.run and with_gradients)
        with torch.set_grad_enabled(with_gradients):
            graph, output = capture(module, inputs, loaded.name, observer, loaded.source_path, options.capture)
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


def model_location(loaded) -> Optional[Location]:
    """Where the model is defined, for findings that have no line of their own: its class when the
    model's file defines it, else the line there that defines the name it was loaded as (``model =
    resnet18()``, ``def build():``), else the file's first line."""
    path = loaded.source_path
    if not path:
        return None
    line = None
    try:
        cls_file = inspect.getsourcefile(type(loaded.module))
        if cls_file and os.path.abspath(cls_file) == os.path.abspath(path):
            line = inspect.getsourcelines(type(loaded.module))[1]
    except (OSError, TypeError):
        pass
    if line is None:
        line = _top_level_definition(path, loaded.name.rsplit(":", 1)[-1]) or 1
    return Location(path, line, 1)


def _top_level_definition(path: str, name: str) -> Optional[int]:
    """The line of the module-level class, function or assignment that defines ``name`` in ``path``."""
    import ast

    from preclint.source.lines import file_text

    text = file_text(path)
    if not text or not name.isidentifier():
        return None
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return stmt.lineno
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return stmt.lineno
    return None


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


def display_location(location: Location) -> Location:
    """A location as reports print it: relative to the working directory, or, in a library's file,
    to the directory the library is imported from (source.paths.display_place)."""
    if location.library:
        return location
    from preclint.source.paths import display_place

    path, library = display_place(location.path)
    return Location(path, location.line, location.column, library)


def relativize(findings: Sequence[Finding]) -> None:
    for f in findings:
        if f.location is not None:
            f.location = display_location(f.location)
        f.related = tuple((display_location(loc), text) for loc, text in f.related)


# An output whose RMS is below a millionth of the values that produce it (the RMS of sqrt(sum (a b)^2)
# over the terms of the dot product that makes it, else its operands) is rounding residue, not a
# value: float32 itself resolves such a sum only to about u * sqrt(K) of its terms (u = 6e-8,
# sqrt(K) ~ 16 for K ~ 256), so its digits carry nothing, and its relative error compares noise with
# noise (an unrelated output of the same size differs by sqrt(2): the 141% such outputs used to show).
DEGENERATE_RATIO = 1e-6


@dataclass
class DegenerateOutput:
    node: str  # the node that produces the output
    rms: float
    feeding_rms: float  # RMS of the values it is computed from (0 when unknown)

    def describe(self, display) -> str:
        if self.rms == 0:
            return f"{display(self.node)} is all zero"
        return (f"{display(self.node)} has RMS {sci(self.rms)}, under a millionth of the values it is computed "
                f"from (RMS {sci(self.feeding_rms)})")


def degenerate_outputs(graph: Graph) -> List[DegenerateOutput]:
    """The model's float outputs that are all zero or rounding residue (DEGENERATE_RATIO), from the
    reference pass: a zero-initialised head (torchvision's vit_b_16, timm's MLP-Mixer) gives them."""
    from preclint.ir import DOT_PRODUCT_KINDS, Kind

    found = []
    for output in graph.output_nodes:
        for name in output.inputs:
            node = graph.get(name)
            while node is not None and node.kind == Kind.SHAPE and node.inputs:  # a reshape or getitem of it
                node = graph.get(node.inputs[0])
            stats = node.out if node is not None else None
            if stats is None or not stats.is_float or not stats.finite or stats.numel == 0:
                continue
            if node.kind in DOT_PRODUCT_KINDS and node.dot_rms is not None:
                feeding = node.dot_rms  # sqrt(sum (a b)^2): what float32 resolves the sum to a fraction of
            else:
                feeding = max([s.rms for s in node.input_stats if s is not None and s.is_float and s.finite] + [0.0])
            if stats.rms == 0 or stats.rms < DEGENERATE_RATIO * feeding:
                found.append(DegenerateOutput(node.name, stats.rms, feeding))
    return found


def all_outputs_degenerate(graph: Graph, found: Optional[Sequence[DegenerateOutput]] = None) -> bool:
    """Whether every float output is degenerate: then no relative error of the output is reported."""
    found = degenerate_outputs(graph) if found is None else found
    floats = sum(1 for output in graph.output_nodes for name in output.inputs
                 if graph.get(name) is not None and graph[name].out is not None and graph[name].out.is_float)
    return bool(found) and len(found) >= floats


def degenerate_note(found: Sequence[DegenerateOutput], display) -> str:
    what = "; ".join(d.describe(display) for d in found)
    return (f"the output is degenerate with these weights ({what}), so the check is vacuous: that output is "
            "zeros or rounding residue at every precision (a zero-initialised head does this). Pass trained "
            "weights with --weights FILE (a state dict); relative errors of such an output are not reported.")


def summarize(ctx: Context, degenerate: bool = False) -> Dict[str, Dict]:
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


def check_model(loaded, config: Config, options: CheckOptions) -> Tuple[Report, Graph, Context]:
    from preclint.predict import predict

    for mode in options.modes:
        if mode not in MODES:
            raise UserError(f"unknown precision '{mode}' (known: {', '.join(MODES)})")
    graph = build_graph(loaded, options)
    predictions = predict(graph, options.modes)
    ctx = Context(graph, tuple(options.modes), predictions, options.rtol, options.atol, model_location(loaded))
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


def attach_source_locations(findings: List[Finding], loaded, graph: Optional[Graph] = None) -> None:
    """Point each finding at the line that made its op, and at the user's lines that lead there.

    The op's line may be a library's (``torchvision/models/resnet.py``): the user's line that calls
    into the library and the line that builds the module (or, failing both, the model's definition)
    then follow as related locations, for the formats meant for code review to annotate. A finding
    with no line of its own goes to the line that builds its module, else stays at the model's
    definition.
    """
    from preclint.source.paths import library_path

    modules = {f.module for f in findings if f.module}
    # nothing to place: don't pay for parsing (or importing libcst)
    definitions = module_definition_locations(loaded.module, modules) if modules else {}
    fallback = model_location(loaded)
    for f in findings:
        built = definitions.get(f.module)
        if f.location is None or f.location == fallback:
            f.location = built or f.location
            continue
        related = []
        if library_path(f.location.path) is not None:
            node = graph.get(f.node) if graph is not None and f.node else None
            call = next((loc for loc in (node.stack if node is not None else ()) if library_path(loc.path) is None), None)
            if call is not None:
                library = library_path(f.location.path).split("/", 1)[0].removesuffix(".py")
                related.append((call, f"the call into {library} that reaches {f.module or f.op or 'this op'}"))
            if built is None and call is None and fallback is not None and library_path(fallback.path) is None:
                related.append((fallback, "the model is built here"))
        if built is not None and not any(_same_line(built, loc) for loc in [f.location] + [loc for loc, _ in related]):
            related.append((built, f"{f.module} is built here"))
        f.related = f.related + tuple(related)


def _same_line(a: Location, b: Location) -> bool:
    return (os.path.abspath(a.path), a.line) == (os.path.abspath(b.path), b.line)
