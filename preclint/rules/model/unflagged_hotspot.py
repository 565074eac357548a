"""PCL900 unflagged-hotspot: a layer the probe measured holding a large share of the output error,
which no rule flagged, where that tells the user something. It fires only after a probe
(``preclint check --probe``, ``preclint probe``).
"""
from __future__ import annotations

import math
from typing import Optional

from preclint.core.findings import ErrorFigure, percent, sci
from preclint.predict.error_model import PREDICTED_ERRORS_NEED
from preclint.predict.ordinary import FLOAT32_NOISE, ordinary_local
from preclint.rules.base import Example, Rule

# A node is a hot spot when its measured share of a mode's output error (ledger.py: contribution)
# is at least this: at most five nodes per mode can be, and one fifth of the error is where keeping
# a single layer in float32 starts to pay for itself.
MIN_SHARE = 0.2
# Some layer always holds the largest share, so a share alone says nothing. A hot spot is reported
# when the output misses the tolerance it is compared with, or when the layer's own (local) error is
# more than EXCESS times what ordinary rounding gives its kind of op under the mode (ordinary_local):
# the error model's predicted output errors lie within a factor of 3 of the measured ones (115 of 118
# zoo and example pairs on an H200), and every rounding layer of tiny_gpt and resnet18 measured at most
# 1.11 times ordinary_local under emulation (benchmarks/CLAIMS.md); beyond 3 the layer does not round
# the way the model of ordinary rounding says (a fused op that amplifies its own rounding inside, a
# kernel that accumulates in the low format), which is what no rule can see.
EXCESS = 3.0


def _stem_dominated():
    """A stem conv over large inputs holds most of the error of an output that misses rtol=1e-4."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 7, stride=2, padding=3), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10),
    ).eval()
    return model, (torch.rand(2, 3, 32, 32) * 50,)


def _fused_attention():
    """nn.MultiheadAttention on unnormalised inputs (RMS 10): its logits are large, and rounding its
    queries and keys moves the softmax inside the fused module by about ten times what a matmul's
    rounding ordinarily gives; the per-op rules never see inside it."""
    import torch

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)
            self.head = torch.nn.Linear(32, 10)

        def forward(self, x):
            return self.head(self.attn(x, x, x, need_weights=False)[0])

    torch.manual_seed(0)
    model = Attention().eval()
    return model, (torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1)) * 10,)


def _healthy_mlp():
    """Two linear layers rounding as the error model says: some layer holds the largest share, as always."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).eval()
    return model, (torch.randn(8, 64),)


def _float32_only():
    """Nothing rounds under the measured mode (no conv or matmul for TF32 to touch): no hot spot."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.GELU()).eval(), (torch.randn(4, 16),)


class UnflaggedHotspot(Rule):
    code = "PCL900"
    needs = PREDICTED_ERRORS_NEED
    name = "unflagged-hotspot"
    summary = "A layer holds a large measured share of a precision's output error that no rule explains."
    severity = "info"
    needs_probe = True
    why = """
The rules flag patterns known to be risky. The probe measures every layer's share of the output
error; some layer always holds the largest share, so a share alone is no finding. A layer is
reported when it holds a fifth or more of the error of an output that misses the tolerance it is
compared with (a warning: keeping that one layer in float32 buys the most accuracy), or when its
own error is over three times what ordinary rounding gives its kind of op under that precision
(info): a fused module that amplifies its own rounding inside (attention on large logits, a
recurrent cell), or a kernel that accumulates in the low format. A model whose layers all round
ordinarily gets no PCL900.
"""
    example = """
self.attn = nn.MultiheadAttention(32, 4)   # probe: 99% of the bf16 output error, 9.7x ordinary
"""
    fix = """
Keep the layer in float32 where the output error matters (`with torch.autocast(device, enabled=False):`
around it, inputs `.float()`), scale its inputs down (normalise before attention), or accept the
error with a tolerance that covers it. `preclint probe` shows the layer's local, received and
amplified error.
"""
    # Run by the probe's tests (tests/probe/test_probe_cli.py): plain checks never fire this rule.
    probe_bad = (
        Example(_stem_dominated, "a conv stem over large inputs holds most of an output error that misses rtol=1e-4",
                {"precisions": ("fp16",), "rtol": 1e-4, "atol": 0.0}),
        Example(_fused_attention, "attention on large logits rounds ten times worse than a matmul",
                {"precisions": ("bf16",)}),
    )
    probe_good = (
        Example(_healthy_mlp, "a two-layer MLP rounding ordinarily", {"precisions": ("tf32", "fp16", "bf16")}),
        Example(_stem_dominated, "the conv stem again, without a tolerance: its error is ordinary",
                {"precisions": ("fp16",)}),
        Example(_float32_only, "LayerNorm and GELU under TF32: nothing rounds", {"precisions": ("tf32",)}),
    )

    def check_probe(self, ctx, result, flagged):
        """Findings for the measured hot spots that no finding in ``flagged`` (node names) covers."""
        tolerance_missed = {mode for mode, m in result.modes.items() if m.tolerance is not None and m.tolerance.failing}
        hot = {}  # node -> mode -> (measure, ordinary local error)
        for mode, measure in result.modes.items():
            if measure.error is not None or not measure.output or not measure.output_finite:
                continue
            if measure.output.rel_error is None or measure.output.rel_error < FLOAT32_NOISE:
                continue
            if result.within_noise(measure.output.rel_error):  # shares of the model's own noise tell nothing
                continue
            for name, m in measure.nodes.items():
                if m.contribution is None or m.contribution < MIN_SHARE or name in flagged:
                    continue
                node = ctx.graph.get(name)
                ordinary = ordinary_local(node, mode, m.dtype) if node is not None else None
                if mode in tolerance_missed or _excessive(m, ordinary):
                    hot.setdefault(name, {})[mode] = (m, ordinary)
        for name in [n for n in result.order if n in hot]:
            yield self._finding(ctx, ctx.graph[name], hot[name], tolerance_missed)

    def _finding(self, ctx, node, modes, tolerance_missed):
        parts = []
        for mode, (m, _) in modes.items():
            text = f"{percent(m.contribution)} of the {mode} output error"
            predicted = ctx.predictions[mode].contributions.get(node.name) if mode in ctx.predictions else None
            if predicted is not None:
                text += f" (predicted {percent(predicted)})"
            parts.append(text)
        missed = [mode for mode in modes if mode in tolerance_missed]
        excess = [(mode, m, ordinary) for mode, (m, ordinary) in modes.items() if _excessive(m, ordinary)]
        reasons = []
        if missed:
            reasons.append(f"the {', '.join(missed)} output misses the tolerance")
        for mode, m, ordinary in excess[:1]:
            if ordinary > 0:
                reasons.append(f"its own {mode} error {sci(m.local.rel_error)} is {m.local.rel_error / ordinary:.1f}x "
                               f"what ordinary rounding gives this op ({sci(ordinary)})")
            else:  # an op that rounds nothing ordinarily (a copy, a max) and still has an error of its own
                reasons.append(f"its own {mode} error {sci(m.local.rel_error)} where ordinary rounding gives this op none")
        message = f"{ctx.display(node.name)} holds {', '.join(parts)}, measured: {'; '.join(reasons)}; no rule flagged it."
        measured = {mode: ErrorFigure(m.local.rel_error if m.local else None, m.local.max_abs_error if m.local else None)
                    for mode, (m, _) in modes.items()}
        predicted = {mode: ctx.node_figure(node, mode) for mode in modes if mode in ctx.predictions}
        severity = "warning" if missed else self.severity
        finding = self.finding(node, message, predicted=predicted, severity=severity, precisions=tuple(modes))
        finding.measured = measured
        finding.status = "confirmed"
        return finding


def _excessive(m, ordinary: Optional[float]) -> bool:
    """Whether a node's measured local error is far above ordinary rounding (EXCESS) and above float32's own."""
    local = m.local.rel_error if m.local is not None else None
    if local is None or not math.isfinite(local) or local < FLOAT32_NOISE or ordinary is None:
        return False
    return local > EXCESS * ordinary
