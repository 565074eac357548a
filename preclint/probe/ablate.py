"""One node at a time: the exact check of the contributions (``--ablate``).

For each node with a local error vector e_i, the float64 reference runs again with only that node's
value replaced by reference + e_i: everything before it is the reference, everything after it exact.
Its output error E_i is then the node's exact effect, with no linearisation. The node's ablation
share <E_i, E> / ||E||^2 is what the adjoint contribution <J_i e_i, E> / ||E||^2 estimates; ``alone``
is ||E_i|| / ||E||, the output error the node would cause by itself.

On FX graphs a run starts at the node and recomputes only what depends on it; models recorded
eagerly run whole. Either way this costs one (partial) float64 forward per node: for small models.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

from preclint.core.ir import Kind
from preclint.core.notes import Note
from preclint.load.modelio import Inputs
from preclint.capture.observer import Observer
from preclint.measure.program import Program
from preclint.measure.execute import tensors
from preclint.probe.ledger import ModeMeasure
from preclint.probe.readback import Pending
from preclint.probe.reference_pass import ReferenceStore


class _Inject(Observer):
    """Replaces one node's output by ``value``."""

    def __init__(self, name: str, value: Any) -> None:
        self.name = name
        self.value = value

    def __call__(self, node, args, kwargs, callee, output):
        return self.value if node.name == self.name else output


def _perturbed(raw: Any, errors: List[Optional[torch.Tensor]]) -> Any:
    flat, spec = tree_flatten(raw)
    index = 0
    out = []
    for v in flat:
        if isinstance(v, torch.Tensor):
            e = errors[index] if index < len(errors) else None
            if e is not None and v.is_floating_point() and e.shape == v.shape:
                v = v + e.to(v.dtype)
            index += 1
        out.append(v)
    return tree_unflatten(out, spec)


def _descendants(graph, name: str) -> set:
    users: Dict[str, List[str]] = {}
    for node in graph.nodes:
        for source in node.inputs:
            users.setdefault(source, []).append(node.name)
    found, frontier = set(), [name]
    while frontier:
        for user in users.get(frontier.pop(), []):
            if user not in found:
                found.add(user)
                frontier.append(user)
    return found


def ablate(copies, graph, ref: ReferenceStore, pending: Pending, measure: ModeMeasure) -> None:
    """Fill ``ablation`` of every node with a local error (the sweep's error vectors), and
    ``measure.agreement``. ``copies``: the probe's DeviceCopies, whose float64 model and inputs run
    with one node's error at a time."""
    program: Program = copies.program
    model64: torch.nn.Module = copies.model64
    inputs64 = copies.inputs64
    errors, output_error = pending.swept.observer.errors, pending.outputs.errors
    total = [e for e in output_error if e is not None]
    norm_sq = sum(float(torch.sum(e * e)) for e in total)
    if not total or not math.isfinite(norm_sq) or norm_sq == 0:
        measure.notes.append(Note("probe", "ablation skipped: the output error is zero or not finite"))
        return
    ref_floats = [t for t in tensors(ref.output) if t.is_floating_point()]
    with torch.no_grad():
        for name in ref.order:
            node_errors = errors.get(name)
            m = measure.nodes.get(name)
            if m is None or not node_errors or all(e is None for e in node_errors):
                continue
            if all(float(e.abs().max()) == 0 for e in node_errors if e is not None and e.numel()):
                m.ablation = {"contribution": 0.0, "alone": 0.0}
                continue
            value = _perturbed(ref.raw[name], node_errors)
            inputs = inputs64
            if program.is_fx:
                keep = _descendants(graph, name)
                env = {n: ref.raw[n] for n in ref.order if n not in keep and n != name}
                env[name] = value
                out = program.run(model64, inputs, Observer(), initial_env=env)
            elif graph.get(name) is not None and graph[name].kind == Kind.INPUT:
                inputs = _replace_input(inputs64, ref.values[name][0], value)
                out = program.run(model64, inputs, Observer())
            else:
                out = program.run(model64, inputs, _Inject(name, value))
            outs = [t for t in tensors(out) if t.is_floating_point()]
            dot = 0.0
            sq = 0.0
            for o, r, e in zip(outs, ref_floats, output_error):
                if e is None or o.shape != r.shape:
                    continue
                d = o.double() - r
                dot += float(torch.sum(d * e))
                sq += float(torch.sum(d * d))
            m.ablation = {"contribution": dot / norm_sq, "alone": math.sqrt(sq / norm_sq)}
    measure.agreement = agreement(measure)


def _replace_input(inputs, original: torch.Tensor, value: torch.Tensor) -> Inputs:
    return Inputs.of(inputs).map(
        lambda v: value if v.data_ptr() == original.data_ptr() and v.shape == original.shape else v)


def agreement(measure: ModeMeasure) -> Optional[Dict[str, Any]]:
    """How well the adjoint contributions match the exact one-node runs."""
    pairs = [(name, m.contribution, m.ablation["contribution"]) for name, m in measure.nodes.items()
             if m.ablation is not None and m.contribution is not None]
    if not pairs:
        return None
    a = [p[1] for p in pairs]
    b = [p[2] for p in pairs]
    result: Dict[str, Any] = {
        "nodes": len(pairs),
        "sum_adjoint": sum(a),
        "sum_ablation": sum(b),
        "max_abs_difference": max(abs(x - y) for x, y in zip(a, b)),
        "correlation": _pearson(a, b),
    }
    # nodes that matter: at least 5% of the output error by the exact measure
    major = [(x, y) for x, y in zip(a, b) if abs(y) >= 0.05]
    if major:
        ratios = sorted(x / y for x, y in major)
        result["major_nodes"] = len(major)
        result["major_within_2x"] = sum(1 for r in ratios if 0.5 <= r <= 2.0) / len(major)
        result["major_ratio_median"] = ratios[len(ratios) // 2]
    top = min(5, len(pairs))
    by_ablation = {p[0] for p in sorted(pairs, key=lambda p: -p[2])[:top]}
    by_adjoint = {p[0] for p in sorted(pairs, key=lambda p: -p[1])[:top]}
    result["top5_overlap"] = len(by_ablation & by_adjoint) / top
    return result


def _pearson(a: List[float], b: List[float]) -> Optional[float]:
    n = len(a)
    if n < 2:
        return None
    ma, mb = sum(a) / n, sum(b) / n
    va = sum((x - ma) ** 2 for x in a)
    vb = sum((y - mb) ** 2 for y in b)
    if va <= 0 or vb <= 0:
        return None
    return sum((x - ma) * (y - mb) for x, y in zip(a, b)) / math.sqrt(va * vb)
