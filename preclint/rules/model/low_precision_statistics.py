"""PCL201 low-precision-statistics."""
from __future__ import annotations


from preclint.core.findings import ErrorFigure, sci
from preclint.core.ir import Kind
from preclint.core.numerics import FORMATS, dtype_name
from preclint.rules.base import Example, Rule
from preclint.rules.model._dataflow import ancestors, downstream, users_by_input
from preclint.rules.model._norun import undecided

# reductions that give a normalization its mean, variance or mean square
STATISTICS = frozenset({"mean", "var", "std", "var_mean", "std_mean", "sum", "nanmean"})
SECOND_MOMENTS = frozenset({"var", "std", "var_mean", "std_mean"})
SQUARES = frozenset({"mul", "pow", "square"})
# ops between a statistic and the normalization that applies it (var + eps -> sqrt -> div)
STATISTIC_CHAIN = frozenset({"add", "sqrt", "rsqrt", "reciprocal", "pow", "clamp", "clamp_min", "sub", "mul", "div"})
APPLY = frozenset({"sub", "div", "mul", "true_divide"})


def _channels_first_norm(upcast: bool):
    def build():
        import torch

        class ChannelsFirstNorm(torch.nn.Module):
            """ConvNeXt-style LayerNorm over channels, written by hand after a conv."""

            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 32, 3, padding=1)
                with torch.no_grad():
                    self.conv.weight.mul_(400.0)  # activations of a few hundred, as in deep CNNs

            def forward(self, x):
                h = self.conv(x)
                if upcast:
                    h = h.float()  # statistics in float32: autocast leaves explicit casts alone
                    u = h.mean(1, keepdim=True)
                    d = h - u
                    s = d.pow(2).mean(1, keepdim=True)
                else:
                    u = h.mean(1, keepdim=True)  # mean and x*x stay float16 under autocast
                    d = h - u
                    s = (d * d).mean(1, keepdim=True)
                return d / torch.sqrt(s + 1e-4)

        torch.manual_seed(0)
        return ChannelsFirstNorm(), (torch.randn(1, 3, 16, 16),)

    return build


def _tiny_variance():
    import torch

    class TinyScale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)
            with torch.no_grad():
                self.proj.weight.mul_(1e-4)
                self.proj.bias.zero_()

        def forward(self, x):
            h = self.proj(x)  # |h| ~ 1e-4: its squares are below float16's smallest normal
            v = h.var(dim=-1, keepdim=True)
            return (h - h.mean(dim=-1, keepdim=True)) / torch.sqrt(v + 1e-12)

    torch.manual_seed(0)
    return TinyScale(), (torch.randn(4, 64),)


class LowPrecisionStatistics(Rule):
    code = "PCL201"
    needs = ()
    name = "low-precision-statistics"
    summary = ("Normalization statistics (mean, variance, mean square) computed by hand in float16 or bfloat16 "
               "overflow or underflow.")
    severity = "error"
    # every mode: what decides is the format a value is computed in, and a model that sets autocast
    # itself computes in float16 or bfloat16 under tf32 too
    precisions = ()
    why = """
`F.layer_norm`, `F.group_norm` and `F.rms_norm` compute their statistics in float32 whatever the input
dtype. A normalization written by hand (`x.mean()`, `x.var()`, `(x - u) * (x - u)`, `x * x`) computes
them in the input's dtype, and under autocast that input is float16 after a conv or linear: autocast
runs `pow` in float32 but leaves `mean`, `var` and `mul` in float16. Squares of deviations above 255.9
overflow float16 (the variance becomes inf and the normalized output collapses to 0, as in ConvNeXt's
channels-first LayerNorm), and a variance below float16's smallest normal (6.1e-5) keeps only a few
bits or becomes 0, so the division by its square root explodes. preclint reports a statistic when the
reference values put it, or the squares it averages, outside the format's normal range.
"""
    example = """
u = h.mean(1, keepdim=True)          # float16 under autocast
s = ((h - u) * (h - u)).mean(1, keepdim=True)   # (h-u)^2 > 65504 for |h-u| > 255.9: inf
y = (h - u) / torch.sqrt(s + eps)    # 0 everywhere
"""
    fix = """
Use `F.layer_norm` / `F.group_norm` / `F.rms_norm` (over permuted channels if needed), or upcast for
the statistics and cast back: `hf = h.float(); ...; y.to(h.dtype)`.
"""
    bad = (Example(_channels_first_norm(False), "channels-first LayerNorm by hand after a conv with large activations"),
           Example(_tiny_variance, "variance of values around 1e-4 in float16"))
    good = (Example(_channels_first_norm(True), "the same statistics computed in float32"),)

    def check_graph(self, ctx):
        graph = ctx.graph
        users = users_by_input(graph)
        statistics = [n for n in graph.nodes
                      if n.fn in STATISTICS and n.kind == Kind.REDUCTION and self._normalizes(graph, users, n)]
        if not graph.ran_reference:
            low = [n for n in statistics
                   if any(ctx.predictions[m].nodes[n.name].fmt in ("fp16", "bf16") for m in ctx.modes)]
            yield from undecided(self, ctx, low, "hand-written normalization statistics in a reduced format",
                                 "the values that tell whether they overflow or underflow")
            return
        for node in statistics:
            problems = {}
            for mode in ctx.modes:
                fmt = ctx.predictions[mode].nodes[node.name].fmt
                if fmt not in ("fp16", "bf16"):
                    continue
                problem = self._problem(graph, ctx.predictions[mode], node, FORMATS[fmt])
                if problem is not None:
                    problems[mode] = (fmt, problem)
            if problems:
                yield self._finding(ctx, node, problems)

    @staticmethod
    def _normalizes(graph, users, stat) -> bool:
        """Whether the statistic is applied back to the values it summarizes (x - mean, x / std)."""
        if not stat.inputs:
            return False
        source = stat.inputs[0]
        related = ancestors(graph, source) | {source}
        for user, position in downstream(users, stat.name, lambda user: user.fn in STATISTIC_CHAIN):
            if user.fn in APPLY:
                others = [n for i, n in enumerate(user.inputs) if i != position]
                if any(o in related or source in ancestors(graph, o) for o in others):
                    return True
        return False

    @staticmethod
    def _problem(graph, prediction, stat, fmt):
        """('overflow' | 'underflow', value, detail) when the statistic leaves fmt's normal range."""
        out = stat.out
        if out is None or not out.finite:
            return None
        squared = graph.get(stat.inputs[0]) if stat.inputs else None
        if squared is not None and squared.fn in SQUARES and squared.out is not None and squared.out.finite:
            if prediction.nodes[squared.name].fmt == fmt.name and squared.out.absmax > fmt.max_finite:
                return "overflow", squared.out.absmax, f"the squares it averages ({_square_text(squared)}) reach"
        if out.absmax > fmt.max_finite:
            return "overflow", out.absmax, "it reaches"
        second_moment = stat.fn in SECOND_MOMENTS or (squared is not None and squared.fn in SQUARES)
        if second_moment and 0 < out.absmin_nonzero < fmt.min_normal:
            return "underflow", out.absmin_nonzero, "it falls to"
        return None

    def _finding(self, ctx, node, problems):
        kinds = {p[1][0] for p in problems.values()}
        kind = "overflow" if "overflow" in kinds else "underflow"
        modes = tuple(m for m, (_, p) in problems.items() if p[0] == kind)
        fmt, (_, value, detail) = problems[modes[0]]
        dtype = dtype_name(fmt)
        stat = ctx.display(node.name)
        if kind == "overflow":
            consequence = (f"above {dtype}'s {sci(FORMATS[fmt].max_finite)}: the statistic becomes inf and the "
                           "normalized values collapse to 0 or NaN")
            predicted = {m: ErrorFigure(None, None) for m in modes}
        else:
            normal = FORMATS[fmt].min_normal
            # a subnormal keeps log2(value / smallest subnormal) bits: its relative error is about
            # the subnormal step over the value, and a statistic below half that step is 0
            step = FORMATS[fmt].min_subnormal or FORMATS[fmt].min_normal * FORMATS[fmt].unit_roundoff * 2
            rel = min(1.0, step / 2 / value) if value > 0 else 1.0
            consequence = (f"below {dtype}'s smallest normal {sci(normal)}: it keeps "
                           f"{'no' if rel >= 1 else 'only a few'} bits (relative error up to {sci(rel)}), and the "
                           "division by its root magnifies that")
            predicted = {m: ErrorFigure(rel / 2, None) for m in modes}
        message = (f"The normalization statistic {stat} is computed in {dtype} under {', '.join(modes)}; "
                   f"{detail} {sci(value)}, {consequence}.")
        if node.fn in ("mean", "var", "std", "var_mean", "std_mean", "sum") and any(m in ("fp16", "bf16") for m in modes):
            message += " Autocast upcasts pow, layer_norm and group_norm, but not mean, var or x*x."
        return self.finding(node, message, predicted=predicted, precisions=modes)


def _square_text(node) -> str:
    return "x*x" if node.fn == "mul" else ("x**2" if node.fn == "pow" else node.fn)
