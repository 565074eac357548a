"""PCL900 unflagged-hotspot: a layer the probe measured holding a large share of the output error,
which no rule flagged. It fires only after a probe (``preclint check --probe``, ``preclint probe``).
"""
from __future__ import annotations

from preclint.findings import ErrorFigure, percent, sci
from preclint.rulebase import Example, Rule

# A node is a hot spot when its measured share of a mode's output error (ledger.py: contribution)
# is at least this: at most five nodes per mode can be, and one fifth of the error is where keeping
# a single layer in float32 starts to pay for itself.
MIN_SHARE = 0.2
# Shares of an output error that float32 arithmetic alone would make are noise, not hot spots: the
# mode's output error must pass 2^-17.5, the geometric midpoint between float32's unit roundoff and
# the reduced formats' (2^-11 for TF32 and float16, 2^-8 for bfloat16).
MIN_OUTPUT_ERROR = 2.0 ** -17.5


def _stem_dominated():
    """A stem conv with large inputs whose rounding dominates the output error: no rule flags it."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 7, stride=2, padding=3), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).eval()
    return model, (torch.rand(2, 3, 32, 32) * 50,)


def _float32_only():
    """Nothing rounds under the measured mode (no conv or matmul for TF32 to touch): no hot spot."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU()).eval(), (torch.randn(4, 16),)


class UnflaggedHotspot(Rule):
    code = "PCL900"
    name = "unflagged-hotspot"
    summary = "A layer holds a large measured share of a precision's output error, and no rule flagged it."
    severity = "info"
    needs_probe = True
    why = """
The rules flag patterns known to be risky. Most of a network's reduced-precision error, though,
often comes from one to a dozen ordinary layers (in random-init CNNs usually the earliest ones),
whose inputs or weights are large or whose error the layers after them amplify. The probe measures
every layer's share of the output error; a layer holding a fifth or more of it, with no finding of
its own, is where keeping one layer in float32 buys the most accuracy. It is reported as info, and
as a warning when the measured output misses the tolerance the outputs are compared with.
"""
    example = """
self.stem = nn.Conv2d(3, 64, 7, stride=2)   # probe: 46% of the fp16 output error
"""
    fix = """
Keep the layer in float32 where the output error matters (`with torch.autocast(device, enabled=False):`
around it, inputs `.float()`), scale its inputs down, or accept the error with a tolerance that
covers it. `preclint probe` shows the layer's local, received and amplified error.
"""
    # Run by the probe's tests (tests/test_probe_rules.py): plain checks never fire this rule.
    probe_bad = (Example(_stem_dominated, "a conv stem over large inputs holds most of the error",
                         {"precisions": ("fp16",)}),)
    probe_good = (Example(_float32_only, "LayerNorm and GELU under TF32: nothing rounds", {"precisions": ("tf32",)}),)

    def check_graph(self, ctx):
        return iter(())  # needs measured contributions: the probe calls from_probe()

    def from_probe(self, ctx, result, flagged, tolerance_missed=frozenset()):
        """Findings for the measured hot spots that no finding in ``flagged`` (node names) covers."""
        hot = {}
        for mode, measure in result.modes.items():
            if measure.error is not None or not measure.output or not measure.output_finite:
                continue
            if measure.output.rel_error is None or measure.output.rel_error < MIN_OUTPUT_ERROR:
                continue
            for name, m in measure.nodes.items():
                if m.contribution is not None and m.contribution >= MIN_SHARE and name not in flagged:
                    hot.setdefault(name, {})[mode] = m
        for name in [n for n in result.order if n in hot]:
            node = ctx.graph.get(name)
            if node is None:
                continue
            modes = hot[name]
            parts = []
            for mode, m in modes.items():
                text = f"{percent(m.contribution)} of the {mode} output error"
                predicted = ctx.predictions[mode].contributions.get(name) if mode in ctx.predictions else None
                if predicted is not None:
                    text += f" (predicted {percent(predicted)})"
                parts.append(text)
            first_mode, first = next(iter(modes.items()))
            detail = (f"local error {sci(first.local.rel_error if first.local else None)}, "
                      f"received {sci(first.received.rel_error if first.received else None)} ({first_mode})")
            message = (f"{ctx.display(name)} holds {', '.join(parts)}, measured; no rule flagged it "
                       f"({detail}).")
            measured = {mode: ErrorFigure(m.local.rel_error if m.local else None,
                                          m.local.max_abs_error if m.local else None) for mode, m in modes.items()}
            predicted = {mode: ctx.node_figure(node, mode) for mode in modes if mode in ctx.predictions}
            severity = "warning" if any(mode in tolerance_missed for mode in modes) else self.severity
            finding = self.finding(node, message, predicted=predicted, severity=severity, precisions=tuple(modes))
            finding.measured = measured
            finding.status = "confirmed"
            yield finding
