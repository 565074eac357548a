"""`preclint plan --precision fp8` (and fp8-rowwise, mxfp8, nvfp4): the nn.Linear layers to keep in
bfloat16 so that the output's relative RMS error meets ``--rtol``, chosen from the predictions and
verified by running the model with them kept.

The layers are chosen greedily: while the prediction misses the tolerance, keep the converted layer
with the largest share of the output error per multiply-add (so small layers that hold much error go
first), and predict again. The plan is written as each tool takes it: torchao's ``module_filter_fn``
(and the FQN list it reads), ModelOpt's ``quant_cfg`` exclusions, Transformer Engine's layers to run
outside ``fp8_autocast``, and preclint's own ``keep`` scaling option.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Optional

from preclint.core.numerics import MODES, Mode, scaled_recipes
from preclint.predict.error_model import predict_mode
from preclint.predict.scaled import converted
from preclint.reference.analyses.scaled_operands import ScaledOperands
from preclint.predict.flops import flops
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.runners import run_mode, run_reference, runner_for

MAX_STEPS = 512  # layers kept at most (a model whose every layer must stay is reported as such)


@dataclass
class ScaledPlan:
    precision: str
    rtol: float  # the output's relative RMS error the plan meets
    keep: List[str] = field(default_factory=list)  # module paths kept in bfloat16, in the order chosen
    layers: int = 0  # the nn.Linear layers the recipe converts before the plan
    kept_flops: float = 0.0  # the kept layers' share of those layers' multiply-adds
    predicted_all: Optional[float] = None  # predicted relative RMS output error, every layer converted
    predicted: Optional[float] = None  # the same with the plan's layers kept
    measured: Optional[float] = None  # measured, with the plan (None: not verified)
    measured_all: Optional[float] = None  # measured, every layer converted
    how: str = ""  # how the verification ran

    @property
    def meets_tolerance(self) -> bool:
        value = self.measured if self.measured is not None else self.predicted
        return value is not None and value <= self.rtol

    def exports(self) -> Dict[str, Any]:
        """The plan in the forms the tools take."""
        keep = list(self.keep)
        names = json.dumps(keep)
        tools = MODES[self.precision].exports  # the format as torchao, ModelOpt and Transformer Engine name it
        torchao = None
        if tools.torchao is not None:
            torchao = {
                "fqns_kept": keep,
                "module_filter_fn": (
                    f"KEEP_IN_BF16 = set({names})\n"
                    "def module_filter_fn(module, fqn):\n"
                    "    return fqn not in KEEP_IN_BF16\n"
                    "convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("
                    f"\"{tools.torchao}\"), module_filter_fn=module_filter_fn)"),
            }
        return {
            "preclint": {"scaling": {"keep": keep}},
            "torchao": torchao,
            "modelopt": {"config": tools.modelopt,
                         "quant_cfg": {f"*{path}.*": {"enable": False} for path in keep}},
            "transformer_engine": {"outside_fp8_autocast": keep},
        }

    def to_json(self) -> Dict[str, Any]:
        return {"precision": self.precision, "rtol": self.rtol, "keep": self.keep, "layers": self.layers,
                "kept_flops": self.kept_flops, "predicted_all": self.predicted_all, "predicted": self.predicted,
                "measured_all": self.measured_all, "measured": self.measured, "verified_how": self.how,
                "meets_tolerance": self.meets_tolerance, "exports": self.exports()}

    def render(self) -> str:
        kept = ", ".join(self.keep) if self.keep else "none"
        lines = [f"plan: {self.precision}, output relative RMS error <= {self.rtol:g}",
                 f"  keep in bfloat16: {len(self.keep)} of {self.layers} converted nn.Linear layers "
                 f"({self.kept_flops:.1%} of their multiply-adds): {kept}",
                 f"  predicted: {_figure(self.predicted_all)} with every layer converted, {_figure(self.predicted)} with the plan"]
        if self.measured is not None:
            lines.append(f"  measured: {_figure(self.measured_all)} with every layer converted, {_figure(self.measured)} "
                         f"with the plan ({self.how})")
        lines.append("  " + ("meets the tolerance" if self.meets_tolerance else "does not meet the tolerance"))
        exports = self.exports()
        if exports["torchao"]:
            lines += ["", "torchao:", *("  " + line for line in exports["torchao"]["module_filter_fn"].splitlines())]
        lines += ["", f"ModelOpt ({exports['modelopt']['config']}): quant_cfg exclusions "
                  + json.dumps(exports["modelopt"]["quant_cfg"]),
                  "Transformer Engine: run outside fp8_autocast: " + json.dumps(exports["transformer_engine"]["outside_fp8_autocast"]),
                  "preclint: [tool.preclint.scaling] keep = " + json.dumps(self.keep)]
        return "\n".join(lines) + "\n"


def _figure(value: Optional[float]) -> str:
    return "n/a" if value is None else f"{value:.3g}"


def with_kept(mode: Mode, keep) -> Mode:
    return replace(mode, recipe=replace(mode.recipe, keep=tuple(mode.recipe.keep) + tuple(keep)))


def choose(graph, precision: str, rtol: float) -> ScaledPlan:
    """The layers to keep, from the predictions alone."""
    mode = MODES[precision]
    layer_flops: Dict[str, float] = {}
    for node in graph.nodes:
        if node.record(ScaledOperands) is not None and converted(node, mode):
            layer_flops[node.module_path] = layer_flops.get(node.module_path, 0.0) + flops(node)
    plan = ScaledPlan(precision, rtol, layers=len(layer_flops))
    prediction = predict_mode(graph, mode)
    plan.predicted_all = plan.predicted = prediction.rel_error
    keep: List[str] = []
    while (plan.predicted is None or plan.predicted > rtol) and len(keep) < min(MAX_STEPS, len(layer_flops)):
        shares: Dict[str, float] = {}
        for name, share in prediction.contributions.items():
            path = graph[name].module_path
            if path in layer_flops and path not in keep:
                shares[path] = shares.get(path, 0.0) + share
        if not shares:
            break
        keep.append(max(shares, key=lambda p: (shares[p] / max(layer_flops[p], 1.0), p)))
        prediction = predict_mode(graph, with_kept(mode, keep))
        plan.predicted = prediction.rel_error
    plan.keep = keep
    total = sum(layer_flops.values())
    plan.kept_flops = sum(layer_flops[p] for p in keep) / total if total > 0 else 0.0
    return plan


def verify(plan: ScaledPlan, model, inputs, graph, device: str = "cpu") -> ScaledPlan:
    """Run the model under the plan's precision with its layers kept, and with none kept, against float64."""
    import torch

    target = torch.device("cuda" if device == "auto" and torch.cuda.is_available() else "cpu" if device == "auto" else device)
    model = model.to(target)
    inputs = Inputs.of(inputs).map(lambda t: t.to(target))
    reference = output_tensors(run_reference(model, inputs, target))

    def error(outputs) -> float:
        outputs = output_tensors(outputs)
        num = sum(float((o.double() - r).pow(2).sum()) for o, r in zip(outputs, reference) if r.is_floating_point())
        den = sum(float(r.pow(2).sum()) for r in reference if r.is_floating_point())
        return (num / den) ** 0.5 if den > 0 else 0.0

    plan.measured_all = error(run_mode(model, inputs, plan.precision, target, graph=graph))
    with scaled_recipes({"keep": list(MODES[plan.precision].recipe.keep) + plan.keep} if plan.keep else None):
        plan.measured = error(run_mode(model, inputs, plan.precision, target, graph=graph))
        plan.how = runner_for(plan.precision, target).how
    return plan
