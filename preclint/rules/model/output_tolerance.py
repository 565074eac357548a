"""PCL001 output-tolerance: the output error against the tolerance a comparison of it uses."""
from __future__ import annotations

from preclint.core.numerics import MODES
from preclint.core.findings import ErrorFigure, percent, sci
from preclint.core.tolerances import failing_fraction, passing_atol
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.predict.outputs import output_figures
from preclint.rules.base import Example, Rule


TF32_NOTE = (
    "cuDNN convolutions use TF32 by default on Ampere and newer GPUs; a test turns it off with "
    "torch.backends.cudnn.conv.fp32_precision = 'ieee' (torch >= 2.9) or "
    "@torch.backends.cudnn.flags(allow_tf32=False)"
)


def _patch_embedding():
    import torch

    torch.manual_seed(0)
    return torch.nn.Conv2d(3, 384, kernel_size=14, stride=14), (torch.randn(1, 3, 224, 224),)


def _small_mlp():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)), (torch.randn(4, 64),)


class OutputTolerance(Rule):
    code = "PCL001"
    needs = PREDICTED_ERRORS_NEED
    measured_as = "output"
    name = "output-tolerance"
    summary = "The predicted output error of a precision mode exceeds the tolerance the outputs are compared with."
    severity = "error"
    why = """
A test that compares a reduced-precision run against fp32 with `assert_close(rtol, atol)` fails when
the rounding error of the mode is larger than the tolerance, even though every kernel is correct.
Elements near zero fail first: their allowance `atol + rtol*|y|` shrinks to `atol`, while the error
stays at the mode's unit roundoff times the size of the terms that were summed. preclint predicts
the output error per mode, the fraction of elements that fail, and the layers that cause it.
"""
    example = """
# Conv2d(3, 384, 14, stride=14) in fp16 compared with rtol=1e-3, atol=1e-5:
# about a fifth of the elements fail although the fp16 convolution is correct.
np.testing.assert_allclose(out_fp16, out_fp32, rtol=1e-3, atol=1e-5)
"""
    fix = """
Compare with a tolerance the precision can meet (the message gives one), or keep the layers that
contribute most in fp32. For TF32, turn it off in tests that need fp32 agreement:
`torch.backends.cudnn.conv.fp32_precision = "ieee"` (torch >= 2.9) or
`@torch.backends.cudnn.flags(allow_tf32=False)`.
"""
    bad = (Example(_patch_embedding, "patch-embedding conv compared at rtol=1e-3, atol=1e-5 in fp16",
                   {"precisions": ("fp16-full",), "rtol": 1e-3, "atol": 1e-5}),)
    good = (Example(_patch_embedding, "the same conv compared at a tolerance fp16 can meet",
                    {"precisions": ("fp16-full",), "rtol": 1e-3, "atol": 5e-3}),
            Example(_small_mlp, "no tolerance given: nothing to compare against", {}))

    def check_graph(self, ctx):
        if ctx.rtol is None and ctx.atol is None:
            return
        rtol, atol = ctx.rtol or 0.0, ctx.atol or 0.0
        tolerance = f"rtol={sci(rtol)}, atol={sci(atol)}"
        for mode in ctx.modes:
            p = ctx.predictions[mode]
            if not ctx.graph.ran_reference:
                yield self.finding(None, f"Cannot tell whether {mode} meets {tolerance}: --no-run skipped the reference "
                                         "pass that output errors are predicted from.", severity="info",
                                   precisions=(mode,))
                continue
            if p.output_error is None:
                continue
            if not p.finite:
                yield self.finding(None, f"Under {mode} the output is predicted to overflow to inf/NaN, so no tolerance "
                                         f"({tolerance}) can pass.", fix="See the PCL101 findings for the values that overflow.",
                                   predicted={mode: ErrorFigure(None, None)}, precisions=(mode,))
                continue
            fraction = failing_fraction(p.output_error, p.output_rms, rtol, atol)
            honest = passing_atol(p.output_error, p.output_numel)
            outputs = output_figures(ctx.graph, p, ctx.graph.output_paths)
            if outputs:  # several outputs: each is compared at its own scale (a logit scale of 14, features of 0.2)
                fraction = sum(failing_fraction(o.error, o.rms, rtol, atol) * o.numel for o in outputs) / p.output_numel
                honest = max(passing_atol(o.error, p.output_numel) for o in outputs)
            expected_failures = fraction * p.output_numel
            if expected_failures < 0.5:
                continue
            layers = ", ".join(f"{ctx.display(n)} ({percent(s)})" for n, s in p.top_contributors(3))
            figures = (", ".join(f"{o.name} {sci(o.rel_error)}" for o in outputs) if outputs else
                       f"relative RMS {sci(p.rel_error)}, max abs {sci(p.max_abs_error)}")
            message = (
                f"Under {mode} the predicted output error ({'relative RMS ' if outputs else ''}{figures}) fails "
                f"{tolerance} on about {percent(fraction)} of {p.output_numel} elements."
            )
            fix = f"Compare with atol >= {sci(honest)} (rtol={sci(rtol)}) for {mode}"
            fix += f"; the layers contributing most are {layers}." if layers else "."
            if MODES[mode].rounds_products_only:
                fix += " " + TF32_NOTE + "."
            yield self.finding(None, message, fix=fix, predicted={mode: ctx.output_figure(mode)}, precisions=(mode,))
