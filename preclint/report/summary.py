"""The report's summary of a check: per precision, the predicted output error (per output where
there are several, and with float32 kernels where TF32 is the backend's choice), the layers that hold
most of it, every node's predicted profile for the HTML page, and a note per scaled format."""
from __future__ import annotations

from typing import Dict, List, Sequence

from preclint.core.ir import Graph
from preclint.core.notes import Note
from preclint.core.numerics import MODES
from preclint.locations.attach import display_location
from preclint.predict.outputs import output_figures
from preclint.rules.base import RuleContext
from preclint.predict.error_model import relative_errors
from preclint.predict.scaled import converted
from preclint.reference.analyses.scaled_operands import ScaledOperands


def summarize(ctx: RuleContext, degenerate: bool = False, predicted: bool = True, cases=None) -> Dict[str, Dict]:
    """Per mode, the predicted output error and the layers that hold most of it; ``degenerate``: every
    float output is all zero or rounding residue, and its relative error is not reported (None);
    ``predicted``: False where the statistics the error estimate needs were not computed (no figures);
    ``cases``: tf32's KernelCases (predict/kernel_cases.py), whose float32-kernel figure it adds."""
    summary: Dict[str, Dict] = {}
    for mode in ctx.modes:
        p = ctx.predictions[mode]
        if not predicted:
            summary[mode] = {"predicted_output": {"rel_error": None, "max_abs_error": None, "finite": None}, "top_layers": []}
            continue
        top = p.top_contributors(5)
        summary[mode] = {
            "predicted_output": {
                "rel_error": None if degenerate else p.rel_error,
                "max_abs_error": p.max_abs_error,
                "finite": p.finite if ctx.graph.ran_reference else None,
            },
            "top_layers": [
                {"module": label, "node": name, "share": round(share, 4)}
                for (name, share), label in zip(top, distinct_labels(ctx, [name for name, _ in top]))
            ],
        }
        outputs = output_figures(ctx.graph, p, ctx.graph.output_paths) if not degenerate else []
        if outputs:
            summary[mode]["outputs"] = [figure.as_dict() for figure in outputs]
        second = cases.second_rel_error(p) if cases is not None and MODES[mode].kernel_choice_matters and not degenerate else None
        if second is not None:
            summary[mode]["if_float32_kernels"] = {"rel_error": second,
                                                   "max_abs_error": cases.float32_backend.max_abs_error}
    return summary


def distinct_labels(ctx: RuleContext, names: Sequence[str]) -> List[str]:
    """``ctx.display`` of each node, told apart where two read alike (the two residual adds of one
    block): by the line that makes each, else by the node's name."""
    labels = [ctx.display(name) for name in names]
    for label in {label for label in labels if labels.count(label) > 1}:
        clashing = [i for i, other in enumerate(labels) if other == label]
        places = [ctx.graph[names[i]].location for i in clashing]
        lines = [f"line {place.line}" if place is not None else None for place in places]
        for i, line in zip(clashing, lines):
            labels[i] = f"{label} ({line})" if line and lines.count(line) == 1 else f"{label} ({names[i]})"
    return labels


def predicted_profile(ctx: RuleContext) -> List[Dict]:
    """Every node's predicted errors in execution order (the picture of the whole model the HTML
    report draws): local and received relative RMS error and share of the output error, per mode."""

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


def scaled_notes(graph: Graph, modes: Sequence[str]) -> List[Note]:
    """One note per scaled mode checked: its recipe, and the linear layers it converts (once per module)."""

    notes: List[Note] = []
    for mode in modes:
        recipe = MODES[mode].recipe
        if recipe is None or not graph.ran_reference:
            continue
        layers = {n.module_path: converted(n, MODES[mode]) for n in graph.nodes if n.record(ScaledOperands) is not None}
        delayed = (f"; delayed scaling (amax history {recipe.amax_history}) is modelled in --train's step only, the "
                   "forward's figures scale from the current amax" if recipe.amax_history else "")
        notes.append(Note("prediction", f"{mode}: {sum(layers.values())} of {len(layers)} nn.Linear layers run as "
                                        f"scaled GEMMs ({recipe.describe()}); the rest of the model under bfloat16 "
                                        f"autocast{delayed}"))
    return notes
