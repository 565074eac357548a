"""PCL202 low-precision-reduction."""
from __future__ import annotations

import math

from preclint.core.findings import ErrorFigure, sci
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind
from preclint.core.numerics import C_INPUT, C_OUTPUT, FORMATS, dtype_name, gaussian_max_factor
from preclint.capture.ops import SUMS
from preclint.predict.accumulation import LOW_PRECISION_ACCUMULATION, PRODUCTS, accumulation_error, contraction
from preclint.predict.error_model import PREDICTED_ERRORS_NEED, amplification, relative_errors
from preclint.rules.base import Example, Rule
from preclint.rules.model._norun import undecided

# Reported when the predicted error of the reduction is this many times what rounding its result
# costs: beyond the factor of 3 within which preclint's predictions hold (benchmarks/CLAIMS.md), it is
# not ordinary rounding.
EXCESS = 3.0


def _cumulative_decay(dtype_arg: bool):
    def build():
        import torch

        class DecayScan(torch.nn.Module):
            """State decays of a linear-attention / state-space layer: the running product of per-step
            gates near 1 over 256 steps."""

            def __init__(self):
                super().__init__()
                self.gate = torch.nn.Linear(16, 16)
                with torch.no_grad():
                    self.gate.weight.mul_(2.0)
                    self.gate.bias.fill_(4.6)  # sigmoid ~ 0.99: each step keeps 99% of the state

            def forward(self, x):
                decay = torch.sigmoid(self.gate(x))
                if dtype_arg:
                    return torch.cumprod(decay, dim=1, dtype=torch.float32)
                return torch.cumprod(decay, dim=1)

        torch.manual_seed(0)
        return DecayScan(), (torch.randn(2, 256, 16),)

    return build


class LowPrecisionReduction(Rule):
    code = "PCL202"
    needs = PREDICTED_ERRORS_NEED
    name = "low-precision-reduction"
    summary = "A sum, mean, product or scan over a long axis computed in float16 or bfloat16, whose error grows with the length."
    severity = "warning"
    # every mode: what decides is the format a value is computed in, and a model that sets autocast
    # itself computes in float16 or bfloat16 under tf32 too
    precisions = ()
    why = """
A product of n factors carries the rounding of every factor: its relative error grows as sqrt(n)
times the unit roundoff (more when the factors are alike and round the same way): 2% after 256
steps of a cumulative product in bfloat16 on an H200 (state decays, alphas_cumprod of a schedule).
Sums and scans whose kernel keeps its partial results in the reduced format grow with the length
too (cumsum and cumprod on CUDA; float16 GEMMs when the model turns on
`torch.backends.cuda.matmul.allow_fp16_accumulation`); preclint knows which kernels do from
measurement and predicts the error from the length. Autocast runs sum, prod, cumsum and cumprod in
float32, but a model cast with `.half()` / `.to(torch.bfloat16)` (or an exported float16 engine) runs
them in the reduced format. A reduction whose error stays at the rounding of its result is no
finding, however long.
"""
    example = """
decay = torch.cumprod(torch.sigmoid(self.gate(x)), dim=1)   # 256 steps in bfloat16: ~2% off
"""
    fix = """
Pass `dtype=torch.float32` to the reduction (`torch.cumprod(x, 0, dtype=torch.float32)`,
`x.sum(dtype=torch.float32)`), or compute tables such as noise schedules once in float64 in
`__init__` and keep them as float32 buffers.
"""
    bad = (Example(_cumulative_decay(False), "a cumulative product of decays over 256 steps in a cast model",
                   {"precisions": ("fp16-full", "bf16-full")}),)
    good = (Example(_cumulative_decay(True), "the same product with dtype=torch.float32",
                    {"precisions": ("fp16-full", "bf16-full")}),)

    def check_graph(self, ctx):
        reductions = [n for n in ctx.graph.nodes
                      if n.kind in (Kind.REDUCTION, Kind.SCAN) and (n.fn in SUMS or n.fn in PRODUCTS)]
        if not ctx.graph.ran_reference:
            low = [n for n in reductions if (n.fn in PRODUCTS or n.fn in LOW_PRECISION_ACCUMULATION)
                   and any(ctx.predictions[m].nodes[n.name].fmt in ("fp16", "bf16") for m in ctx.modes)]
            yield from undecided(self, ctx, low, "products and scans in a reduced format",
                                 "their lengths and the error of the values they combine")
            return
        yield from self._fp16_gemms(ctx)
        received = {}
        for node in reductions:
            out = node.out
            if out is None or not out.is_float or not out.finite or not out.rms:
                continue
            figures = {}
            for mode in ctx.modes:
                fmt = ctx.predictions[mode].nodes[node.name].fmt
                if fmt not in ("fp16", "bf16"):
                    continue
                if mode not in received:
                    received[mode] = relative_errors(ctx.graph, ctx.predictions[mode])
                rel, parts = self._error(node, fmt, received[mode])
                if rel >= EXCESS * C_OUTPUT * FORMATS[fmt].unit_roundoff:
                    figures[mode] = (fmt, rel, parts)
            if figures:
                yield self._finding(ctx, node, figures)

    def _fp16_gemms(self, ctx):
        """Dot products whose float16 products the model asked to accumulate in float16
        (torch.backends.cuda.matmul.allow_fp16_accumulation = True): error growing with K."""
        sites = {}
        for node in ctx.graph.nodes:
            if node.kind not in DOT_PRODUCT_KINDS or not contraction(node).fp16_accumulation:
                continue
            for mode in ctx.modes:
                if ctx.predictions[mode].nodes[node.name].fmt != "fp16":
                    continue
                u = FORMATS["fp16"].unit_roundoff
                ordinary = math.hypot(C_INPUT, C_OUTPUT) * u
                rel = math.hypot(ordinary, accumulation_error(node, "fp16"))
                if rel >= EXCESS * ordinary:
                    sites.setdefault(node.name, {})[mode] = rel
        for name, figures in sites.items():
            node = ctx.graph[name]
            mode = max(figures, key=figures.get)
            message = (f"{ctx.display(name)} accumulates {node.reduction_length} float16 products in float16 "
                       f"(allow_fp16_accumulation is on): its relative error is predicted at {sci(figures[mode])} "
                       f"under {mode}, {sci(figures[mode] / (math.hypot(C_INPUT, C_OUTPUT) * FORMATS['fp16'].unit_roundoff))} "
                       "times that of float32 accumulation.")
            out = node.out
            predicted = {m: ErrorFigure(r, r * out.rms * gaussian_max_factor(out.numel) if out else None)
                         for m, r in figures.items()}
            yield self.finding(node, message, predicted=predicted, precisions=tuple(figures),
                               fix="Leave torch.backends.cuda.matmul.allow_fp16_accumulation off (the default) for "
                                   "layers with long reductions, or compute them in bfloat16/float32.")

    @staticmethod
    def _error(node, fmt, received):
        """Relative RMS error of the result: its rounding, the kernel's accumulation in fmt, and for
        products the compounded rounding of the n factors (what the factors carry, times sqrt(n))."""
        u = FORMATS[fmt].unit_roundoff
        n = node.reduction_length or 1
        parts = {"result": C_OUTPUT * u, "accumulation": accumulation_error(node, fmt)}
        if node.fn in PRODUCTS:
            incoming = max((received.get(i, 0.0) for i in node.inputs), default=0.0)
            # each factor carries at least its own storage rounding in fmt
            per_factor = max(incoming, C_OUTPUT * u)
            gain = amplification(node)
            parts["factors"] = per_factor * (gain if gain is not None else math.sqrt(n))
        return math.sqrt(sum(v * v for v in parts.values())), parts

    def _finding(self, ctx, node, figures):
        mode = max(figures, key=lambda m: figures[m][1])
        fmt, rel, parts = figures[mode]
        n = node.reduction_length or 1
        dtype = dtype_name(fmt)
        cause = max(("accumulation", "factors"), key=lambda k: parts.get(k, 0.0))
        why = ("its kernel keeps partial results in " + dtype if cause == "accumulation"
               else f"each of its {n} factors carries its rounding into the product")
        message = (f"{ctx.display(node.name)} {'multiplies' if node.fn in PRODUCTS else 'sums'} {n} values in {dtype} "
                   f"under {mode}: {why}, so its relative error is predicted at {sci(rel)}, "
                   f"{sci(rel / (C_OUTPUT * FORMATS[fmt].unit_roundoff))} times the rounding of its result.")
        out = node.out
        predicted = {m: ErrorFigure(r, r * out.rms * gaussian_max_factor(out.numel)) for m, (_, r, _) in figures.items()}
        return self.finding(node, message, predicted=predicted, precisions=tuple(figures))


__all__ = ["LowPrecisionReduction", "LOW_PRECISION_ACCUMULATION"]
