"""PCL105 fp16-underflow."""
from __future__ import annotations

import math

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.ir import Kind
from preclint.core.numerics import C_OUTPUT, FP16
from preclint.rules.base import Example, Rule

# Reported when the subnormal step costs at least ten times the ordinary rounding of a stored value
# (C_OUTPUT * u, 2e-4 in float16): values with an RMS below about 8e-6.
RISK_FACTOR = 10.0


def subnormal_error(rms: float) -> float:
    """Relative RMS error of storing values of this RMS in float16: below the smallest normal (6.1e-5)
    the step is fixed at 2^-24, uniform rounding error step/sqrt(12); past 100% everything is lost."""
    if rms <= 0:
        return 0.0
    return min(1.0, math.hypot(C_OUTPUT * FP16.unit_roundoff, FP16.min_subnormal / math.sqrt(12.0) / rms))


def _vanishing_stack():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers)
    with torch.no_grad():
        for layer in model:
            if isinstance(layer, torch.nn.Linear):
                layer.weight.mul_(0.1)  # each layer shrinks the signal about 10x: 1e-6 after six
                layer.bias.zero_()
    return model, (torch.randn(8, 64),)


def _scaled_stack():
    import torch

    torch.manual_seed(0)
    layers = []
    for _ in range(6):
        layers += [torch.nn.Linear(64, 64), torch.nn.LayerNorm(64), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers), (torch.randn(8, 64),)


class Fp16Underflow(Rule):
    code = "PCL105"
    size_drift = "vanishing"  # values that drift down with random-init weights
    needs = ()
    name = "fp16-underflow"
    summary = "Values fall below float16's normal range (6.1e-5), where a fixed step of 6e-8 replaces relative precision."
    severity = "warning"
    precisions = ("fp16", "fp16-full")
    why = """
Below its smallest normal number, 6.1e-5, float16 keeps a fixed absolute step of 2^-24 (6e-8):
values of 1e-6 carry a relative error of a few percent, values under 3e-8 become 0. Deep stacks
whose activations shrink layer by layer (random-init or badly scaled networks, squeeze-and-excite
gates of small features, products of probabilities) lose their signal in float16 while bfloat16,
with float32's range, keeps it. The error is not ordinary rounding: it does not shrink with the
value, so whole outputs can vanish.
"""
    example = """
h = self.layers(x)        # RMS 1e-6 after layers that each shrink the signal
y = self.head(h)          # under autocast(float16) h is stored in float16: 5% error, tails flushed to 0
"""
    fix = """
Keep the values in range: normalize (LayerNorm/BatchNorm), rescale weights or inputs, or compute the
small quantities in float32 or bfloat16; for probabilities work with logarithms.
"""
    bad = (Example(_vanishing_stack, "six linear layers that each shrink the signal tenfold"),)
    good = (Example(_scaled_stack, "the same stack with LayerNorm after each layer"),)

    def check_graph(self, ctx):
        if not ctx.graph.ran_reference:
            return
        origins = {}  # origin node -> {mode: (its relative error, worst downstream, later values)}
        for mode in ctx.modes:
            origin_of = {}
            for node in ctx.graph.nodes:
                out = node.out
                if node.kind in (Kind.OUTPUT, Kind.INPUT, Kind.CONSTANT) or out is None or not out.is_float:
                    continue
                if not out.finite or ctx.predictions[mode].nodes[node.name].fmt != "fp16":
                    continue
                relative = subnormal_error(out.rms)
                if relative < RISK_FACTOR * C_OUTPUT * FP16.unit_roundoff:
                    continue
                # a value computed from underflowing inputs belongs to the first of them that underflowed
                origin = next((origin_of[i] for i in node.inputs if i in origin_of), node.name)
                origin_of[node.name] = origin
                own, worst, later = origins.setdefault(origin, {}).get(mode, (relative, 0.0, -1))
                origins[origin][mode] = (own, max(worst, relative), later + 1)
        order = {node.name: i for i, node in enumerate(ctx.graph.nodes)}
        for name in sorted(origins, key=order.get):
            node = ctx.graph[name]
            per_mode = origins[name]
            own = max(v[0] for v in per_mode.values())
            worst = max(v[1] for v in per_mode.values())
            later = max(v[2] for v in per_mode.values())
            predicted = {m: ErrorFigure(v[0], v[0] * node.out.absmax) for m, v in per_mode.items()}
            message = (
                f"{ctx.display(name)} holds values of RMS {sci(node.out.rms)} (largest {sci(node.out.absmax)}) "
                f"under {', '.join(per_mode)}, below float16's smallest normal 6.1e-05: stored in float16 they "
                f"carry a relative error of {percent(own)}"
            )
            if later > 0:
                lost = "everything is lost" if worst >= 1.0 else f"up to {percent(worst)}"
                values = "value stays" if later == 1 else "values stay"
                message += f"; {later} later {values} below the normal range and {lost} there."
            else:
                message += "." if own < 1.0 else ", that is, they are lost."
            severity = "error" if worst >= 0.5 else "warning"
            yield self.finding(node, message, predicted=predicted, severity=severity, precisions=tuple(per_mode))
