"""`preclint plan --formats nvfp4,mxfp8,fp8,bf16`: a format per nn.Linear layer, the cheapest the
output's relative RMS error allows, chosen from the predictions and verified by running the mixed
assignment.

Every layer starts in the cheapest listed format that converts it (fewest bits per element, the
scales counted: nvfp4 4.5, fp8 and fp8-rowwise 8, mxfp8 8.25, bf16 16). While the prediction
misses ``--rtol``, the layer whose move to its next wider format removes the most predicted error
variance per multiply-add moves. The error model adds the nodes' error variances, so a mixed
assignment's prediction is the all-bf16 prediction plus, per layer, its variance in its format
minus its variance in bf16 (each from the prediction of that format with every layer converted).
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from preclint.core.errors import UserError
from preclint.core.numerics import MODES, SCALED_MODES, scaled_recipes
from preclint.plan.scaled import with_kept
from preclint.predict.error_model import predict_mode
from preclint.predict.scaled import converted
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.predict.flops import flops
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.runners import run_mode, run_reference, runner_for
from preclint.measure.scaled import gemm_backend, ScaledLinear
from preclint.plan import scaled

BF16 = "bf16"  # the format of the layers no scaled format takes (bf16 autocast)


def parse_formats(text: str) -> List[str]:
    """The listed formats, cheapest first; a mistake is a UserError."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = (*SCALED_MODES, BF16)
    for name in names:
        if name not in known:
            raise UserError(f"unknown format {name!r} in --formats: choose from {', '.join(known)}")
    if not any(name in SCALED_MODES for name in names):
        raise UserError(f"--formats needs at least one scaled format ({', '.join(SCALED_MODES)}) besides bf16")
    return sorted(dict.fromkeys(names), key=lambda name: MODES[name].bits_per_element)


@dataclass
class FormatsPlan:
    formats: List[str]  # cheapest first
    rtol: float
    assignment: Dict[str, str] = field(default_factory=dict)  # layer path -> format
    layer_flops: Dict[str, float] = field(default_factory=dict)
    predicted_cheapest: Optional[float] = None  # every layer in its cheapest listed format
    predicted: Optional[float] = None
    measured: Optional[float] = None
    how: str = ""

    @property
    def meets_tolerance(self) -> bool:
        value = self.measured if self.measured is not None else self.predicted
        return value is not None and value <= self.rtol

    def layers_in(self, fmt: str) -> List[str]:
        return [path for path, f in self.assignment.items() if f == fmt]

    def flops_share(self, fmt: str) -> float:
        total = sum(self.layer_flops.values())
        return sum(self.layer_flops[p] for p in self.layers_in(fmt)) / total if total > 0 else 0.0

    def exports(self) -> Dict[str, Any]:
        used = [f for f in self.formats if self.layers_in(f)]
        quant_cfg: Dict[str, Any] = {}
        for fmt in used:
            for path in self.layers_in(fmt):
                # the layer at the root and under a wrapper, not another whose name ends the same ("*proj" would
                # take "out_proj")
                for prefix in ("", "*."):
                    if fmt == BF16:
                        quant_cfg[f"{prefix}{path}.*"] = {"enable": False}
                    else:
                        for side, attrs in MODES[fmt].exports.modelopt_quantizers.items():
                            quant_cfg[f"{prefix}{path}.{side}_quantizer"] = attrs
        scaled = [f for f in used if f != BF16]
        torchao_lines = []
        for fmt in (f for f in scaled if MODES[f].exports.torchao is not None):
            names = json.dumps(self.layers_in(fmt))
            torchao_lines.append(f"convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("
                                 f"\"{MODES[fmt].exports.torchao}\"), module_filter_fn=lambda module, fqn: fqn in {names})")
        return {
            "preclint": {"formats": dict(self.assignment)},
            "torchao": {"fqns": {f: self.layers_in(f) for f in used},
                        "float8": "\n".join(torchao_lines) or None},
            "modelopt": {"config": MODES[scaled[0]].exports.modelopt if scaled else None, "quant_cfg": quant_cfg,
                         "python": "quant_cfg.update(" + repr(quant_cfg) + ")"},
            "transformer_engine": {"recipes": {f: MODES[f].exports.transformer_engine for f in scaled},
                                   "layers": {f: self.layers_in(f) for f in scaled},
                                   "outside_fp8_autocast": self.layers_in(BF16)},
        }

    def to_json(self) -> Dict[str, Any]:
        return {"formats": self.formats, "rtol": self.rtol, "assignment": self.assignment,
                "layers": len(self.assignment), "flops_share": {f: self.flops_share(f) for f in self.formats},
                "predicted_cheapest": self.predicted_cheapest, "predicted": self.predicted,
                "measured": self.measured, "verified_how": self.how, "meets_tolerance": self.meets_tolerance,
                "exports": self.exports()}

    def render(self) -> str:
        lines = [f"plan: formats {','.join(self.formats)}, output relative RMS error <= {self.rtol:g}"]
        for fmt in self.formats:
            paths = self.layers_in(fmt)
            lines.append(f"  {fmt}: {len(paths)} of {len(self.assignment)} nn.Linear layers "
                         f"({self.flops_share(fmt):.1%} of their multiply-adds)" + (": " + ", ".join(paths) if paths else ""))
        lines.append(f"  predicted: {_figure(self.predicted_cheapest)} with every layer in its cheapest format, "
                     f"{_figure(self.predicted)} with the plan")
        if self.measured is not None:
            lines.append(f"  measured: {_figure(self.measured)} with the plan ({self.how})")
        lines.append("  " + ("meets the tolerance" if self.meets_tolerance else "does not meet the tolerance"))
        exports = self.exports()
        if exports["torchao"]["float8"]:
            lines += ["", "torchao:", *("  " + line for line in exports["torchao"]["float8"].splitlines())]
        lines += ["", f"ModelOpt ({exports['modelopt']['config']}): {exports['modelopt']['python']}",
                  "Transformer Engine: " + json.dumps({f: {"recipe": exports["transformer_engine"]["recipes"][f],
                                                           "layers": layers}
                                                       for f, layers in exports["transformer_engine"]["layers"].items()})
                  + "; outside fp8_autocast: " + json.dumps(exports["transformer_engine"]["outside_fp8_autocast"]),
                  "preclint: " + json.dumps(self.assignment)]
        return "\n".join(lines) + "\n"


def _figure(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def _layer_variances(graph, prediction, paths) -> Dict[str, float]:
    """Each layer's predicted share of the output error variance, in absolute terms (relative to the output's RMS^2)."""
    if prediction.output_error is None or not prediction.output_rms:
        return {}
    total = (prediction.output_error / prediction.output_rms) ** 2
    variances: Dict[str, float] = {}
    for name, share in prediction.contributions.items():
        path = graph[name].module_path
        if path in paths:
            variances[path] = variances.get(path, 0.0) + share * total
    return variances


def choose(graph, formats: Sequence[str], rtol: float) -> FormatsPlan:
    """The format of each layer, from the predictions alone (``formats`` cheapest first)."""
    scaled = [f for f in formats if f != BF16]
    layer_flops: Dict[str, float] = {}
    eligible: Dict[str, List[str]] = {}  # layer -> the listed formats it can run in, cheapest first
    for node in graph.nodes:
        if node.record(ScaledOperands) is None:
            continue
        ok = [f for f in scaled if converted(node, MODES[f])]
        if ok:
            layer_flops[node.module_path] = layer_flops.get(node.module_path, 0.0) + flops(node)
            previous = eligible.get(node.module_path)
            eligible[node.module_path] = ok if previous is None else [f for f in previous if f in ok]
    plan = FormatsPlan(list(formats), rtol, layer_flops=layer_flops)
    if not layer_flops:
        raise UserError(f"no nn.Linear layer of the model converts to {', '.join(scaled)}: nothing to plan")
    paths = set(layer_flops)
    base = predict_mode(graph, with_kept(MODES[scaled[0]], sorted(paths)))  # every layer in bf16
    base_variance = (base.rel_error or 0.0) ** 2
    variance = {BF16: _layer_variances(graph, base, paths)}
    for fmt in scaled:
        prediction = predict_mode(graph, MODES[fmt])
        overflowing = {graph[n].module_path for n, p in prediction.nodes.items() if p.overflow or p.pole}
        variance[fmt] = _layer_variances(graph, prediction, paths)
        for path in overflowing & paths:  # (a NaN scale: the layer cannot run in this format)
            eligible[path] = [f for f in eligible[path] if f != fmt]
    for path in paths:
        eligible[path] = eligible[path] + ([BF16] if BF16 in formats else [])

    def term(path: str, fmt: str) -> float:
        return variance[fmt].get(path, 0.0) - variance[BF16].get(path, 0.0)

    def predicted(assignment: Dict[str, str]) -> Optional[float]:
        if any(not eligible[p] for p in paths):
            return math.inf
        return math.sqrt(max(0.0, base_variance + sum(term(p, f) for p, f in assignment.items())))

    widest = {p: eligible[p][-1] for p in paths if eligible[p]}
    best = predicted(widest)
    if best is None or best > rtol:
        names = ", ".join(formats)
        raise UserError(f"no format in --formats {names} is wide enough: with every layer in the widest the "
                        f"predicted output error is {_figure(best)} > --rtol {rtol:g}"
                        + ("" if BF16 in formats else "; add bf16 to the list"))
    assignment = {p: eligible[p][0] for p in sorted(paths)}
    plan.predicted_cheapest = plan.predicted = predicted(assignment)
    while plan.predicted > rtol:
        moves = {p: eligible[p][eligible[p].index(f) + 1] for p, f in assignment.items() if f != eligible[p][-1]}
        if not moves:
            break
        gain = {p: term(p, assignment[p]) - term(p, wider) for p, wider in moves.items()}
        # the move that removes most error per multiply-add; where none removes any, the layer holding most
        path = max(moves, key=lambda p: (gain[p] > 0, (gain[p] if gain[p] > 0 else term(p, assignment[p]))
                                         / max(layer_flops[p], 1.0), p))
        assignment[path] = moves[path]
        plan.predicted = predicted(assignment)
    plan.assignment = assignment
    return plan


def verify(plan: FormatsPlan, model, inputs, graph, device: str = "cpu") -> FormatsPlan:
    """Run the model with each layer in its format against float64: a copy whose layers of the
    other formats are replaced by their scaled GEMMs first, run under the format of most layers
    with the rest kept."""
    import torch

    target = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device)
    model = model.to(target)
    inputs = Inputs.of(inputs).map(lambda t: t.to(target))
    reference = output_tensors(run_reference(model, inputs, target))
    used = [f for f in plan.formats if f != BF16 and plan.layers_in(f)]
    if not used:  # every layer in bfloat16: bf16 autocast itself
        used = [next(f for f in plan.formats if f != BF16)]
    primary = max(used, key=lambda f: (len(plan.layers_in(f)), -plan.formats.index(f)))
    runner = runner_for(primary, target)
    mixed = copy.deepcopy(model)
    with torch.no_grad():
        for path, fmt in plan.assignment.items():
            if fmt not in (BF16, primary):
                recipe = MODES[fmt].recipe
                mixed.set_submodule(path, ScaledLinear(mixed.get_submodule(path), recipe,
                                                       gemm_backend(recipe, target, runner.emulated),
                                                       native=not runner.emulated))
    keep = [p for p, f in plan.assignment.items() if f != primary]
    with scaled_recipes({"keep": list(MODES[primary].recipe.keep) + keep} if keep else None):
        outputs = output_tensors(run_mode(mixed, inputs, primary, target, graph=graph))
        plan.how = f"{runner_for(primary, target).how}; other formats' layers likewise"
    num = sum(float((o.double() - r).pow(2).sum()) for o, r in zip(outputs, reference) if r.is_floating_point())
    den = sum(float(r.pow(2).sum()) for r in reference if r.is_floating_point())
    plan.measured = (num / den) ** 0.5 if den > 0 else 0.0
    return plan


def scaled_plan(loaded, graph, mode: Optional[str], rtol: float, settings):
    """The plan of scaled formats a session asks for (``settings``: engine.PlanOptions): a format per
    layer from ``settings.formats``, else the layers to keep in bfloat16 under ``mode``; verified
    unless the settings say not to."""

    plan = choose(graph, settings.formats, rtol) if settings.formats else scaled.choose(graph, mode, rtol)
    if settings.verify:
        run = verify if settings.formats else scaled.verify
        run(plan, loaded.module, loaded.inputs, graph, settings.device)
    return plan
