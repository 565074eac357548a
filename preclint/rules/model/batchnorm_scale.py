"""PCL103 batchnorm-scale."""
from __future__ import annotations

import math

from preclint.core.findings import ErrorFigure, sci
from preclint.reference.analyses.batchnorm import BatchNormFolding
from preclint.predict.error_model import PREDICTED_ERRORS_NEED, amplification
from preclint.rules.base import Example, Rule
from preclint.core.numerics import C_OUTPUT, MODES

# A batch norm that multiplies the relative error of its input by more than this is beyond ordinary
# rounding: healthy layers sit near 1 (random init: exactly 1).
AMPLIFICATION_LIMIT = 10.0
# running_var + eps below this is a collapsed channel: a trained channel's variance is of the order of
# its activations' (freshly initialised: 1), one that saw a constant input keeps ~0
COLLAPSED_VARIANCE = 1e-4


def _frozen_resnet(dead_channels: bool):
    def build():
        import torch
        import torchvision

        torch.manual_seed(0)
        model = torchvision.models.resnet18(norm_layer=lambda c: torchvision.ops.misc.FrozenBatchNorm2d(c, eps=0.0))
        model.eval()
        if dead_channels:
            # what pretrained weights can hold: channels whose batch variance collapsed, with eps=0
            with torch.no_grad():
                bn = model.layer1[0].bn1
                bn.running_var[:8] = 1e-9
                bn.running_mean[:8] = 0.5
        return model, (torch.rand(1, 3, 64, 64),)

    return build


def _zero_init_residual():
    import torch

    class Block(torch.nn.Module):
        """A residual branch whose last batch norm starts at gamma = 0 (LeViT, ResNet's
        zero_init_residual), with the running statistics of a fresh layer (mean 0, var 1)."""

        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(16, 16, 3, padding=1)
            self.bn = torch.nn.BatchNorm2d(16)
            torch.nn.init.zeros_(self.bn.weight)

        def forward(self, x):
            return x + self.bn(self.conv(x))

    torch.manual_seed(0)
    return torch.nn.Sequential(Block(), Block()).eval(), (torch.randn(1, 16, 8, 8),)


class BatchNormScale(Rule):
    code = "PCL103"
    needs = PREDICTED_ERRORS_NEED + (BatchNormFolding,)
    name = "batchnorm-scale"
    summary = "A (frozen) batch norm whose folded scale gamma/sqrt(var+eps) float16 cannot hold, or that amplifies rounding error."
    severity = "warning"
    precisions = ("fp16", "fp16-full", "bf16", "bf16-full")
    why = """
Inference folds a batch norm into a per-channel scale gamma/sqrt(running_var + eps) (and exporters fold
it into the preceding conv's weights). With eps=0 (FrozenBatchNorm2d in older torchvision and in
detection code) and channels whose variance collapsed, the scale is huge: float16 cannot hold it
(> 65504), a running_var below 6e-8 is 0 in float16 (the scale becomes inf), a running_var above
65504 is inf. Even when the scale fits, such a channel maps an almost constant input to its bias, so
the input's rounding error reaches the output multiplied by the scale. The weights decide this, not
the architecture: the same network is fine with one checkpoint and far off with another.
"""
    example = """
norm = torchvision.ops.misc.FrozenBatchNorm2d(64, eps=0.0)
norm.running_var[:8] = 1e-9   # collapsed channels in a checkpoint: scale ~ 3e4
"""
    fix = """
Give the batch norm an eps (FrozenBatchNorm2d(..., eps=1e-5), as nn.BatchNorm2d has), fold batch
norms into the conv in float32 or float64 before casting, or keep the layer in float32.
"""
    bad = (Example(_frozen_resnet(True), "resnet18 with FrozenBatchNorm2d(eps=0) and collapsed channels"),)
    good = (Example(_frozen_resnet(False), "the same architecture with healthy statistics"),
            Example(_zero_init_residual, "fresh batch norms (running_var 1), gamma 0 in residual branches"))

    def check_graph(self, ctx):
        modes = list(ctx.modes)
        fp16_modes = [m for m in modes if m.startswith("fp16")]
        full_fp16 = [m for m in modes if m == "fp16-full"]
        for node in ctx.graph.nodes:
            facts = node.record(BatchNormFolding)
            if facts is None:
                continue
            problems, severity, concerned = [], "warning", []
            channels = facts.channels
            if facts.scale_nonfinite:
                problems.append(f"{facts.scale_nonfinite} of {channels} channels have an infinite scale already in "
                                f"fp32 (running_var 0 with eps={sci(facts.eps)})")
                severity, concerned = "error", modes
            if full_fp16 and facts.channels_var_zero_in_fp16 and not facts.scale_nonfinite:
                problems.append(f"running_var of {facts.channels_var_zero_in_fp16} channels plus eps is 0 in "
                                f"float16, so the scale becomes inf")
                severity, concerned = "error", concerned or full_fp16
            if full_fp16 and facts.channels_var_over_fp16:
                problems.append(f"running_var of {facts.channels_var_over_fp16} channels exceeds 65504 (inf in float16)")
                severity, concerned = "error", concerned or full_fp16
            if fp16_modes and facts.channels_scale_over_fp16:
                problems.append(f"the folded scale reaches {sci(facts.scale_absmax)}, beyond float16's 65504, in "
                                f"{facts.channels_scale_over_fp16} channels")
                concerned = concerned or fp16_modes
            folded = facts.folded_weight_absmax
            if fp16_modes and folded is not None and folded > 65504:
                problems.append(f"folded into {facts.folds_into} its weights reach {sci(folded)}, beyond float16's 65504")
                concerned = concerned or fp16_modes
            factor = self._amplification(ctx, node, facts)
            if factor is not None and factor > AMPLIFICATION_LIMIT:
                if facts.var_min + facts.eps < COLLAPSED_VARIANCE:
                    cause = (f"channels with collapsed variance (min running_var {sci(facts.var_min)}, eps "
                             f"{sci(facts.eps)})")
                else:
                    cause = "its input, large against the spread it normalizes,"
                amplified = f"by {sci(factor)}" if math.isfinite(factor) else "without bound (an output of 0 from a nonzero input)"
                problems.append(f"{cause} multiply the relative rounding error of the input {amplified}")
                concerned = concerned or modes
            if not problems:
                continue
            predicted = {}
            for mode in concerned:
                figure = ctx.node_figure(node, mode) if ctx.graph.ran_reference else ErrorFigure(None, None)
                received = self._received_rel(ctx, node, mode, factor)
                # (the node's own figure carries what its parameters leaving the range do: StoredParameters)
                rel = max((f for f in (received, figure.rel_error) if f is not None), default=None)
                predicted[mode] = ErrorFigure(rel, figure.max_abs_error)
            message = f"{ctx.display(node.name)}: " + "; ".join(problems) + "."
            yield self.finding(node, message, predicted=predicted, severity=severity, precisions=tuple(concerned))

    @staticmethod
    def _amplification(ctx, node, facts):
        """How many times the layer multiplies the relative error of its input: measured by the
        reference pass's gradients for the example inputs, and estimated from the running statistics
        as if the inputs followed them. The estimate counts where channels collapsed (the data they
        were gathered on sat at their mean, and deployment data will too, whatever the example
        input does) or where the reference pass did not run; fresh statistics (mean 0, var 1) say
        nothing about the data. A layer whose output is 0 (zero-initialised gamma and beta, as
        residual branches start) passes nothing on: no factor."""

        estimate = facts.amplification
        estimate = estimate if estimate == estimate and estimate > 0 else None
        measured = amplification(node) if ctx.graph.ran_reference else None
        if not ctx.graph.ran_reference or facts.var_min + facts.eps < COLLAPSED_VARIANCE:
            return max((f for f in (measured, estimate) if f is not None), default=None)
        return measured

    @staticmethod
    def _received_rel(ctx, node, mode, amplification):
        """Relative error this layer's output carries: the unit roundoff of its input, amplified."""

        fmt = MODES[mode].low or MODES[mode].dot_format
        if amplification is None or not math.isfinite(amplification):
            return None
        return C_OUTPUT * fmt.unit_roundoff * max(1.0, amplification)
