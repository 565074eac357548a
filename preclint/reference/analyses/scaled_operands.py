"""What each scaled-GEMM recipe (FP8 tensorwise and rowwise, MXFP8, NVFP4) does to the two operands
of a linear layer, from the reference values: the scales it picks, the fractions of values that
saturate, underflow to zero or land in subnormals (per tensor, and across the groups that share a
scale: min, median, p99), the quantisation SQNR, and the error each operand's quantisation puts on
the layer's dot products relative to their terms (the error model's operand rounding).

The last is exact for uncorrelated errors: for y_ij = sum_k x_ik W_jk, an error e of x moves y_ij by
sum_k e_ik W_jk, whose mean square over i, j is sum_k E_k ||W_:k||^2 / (M N) with E_k = sum_i e_ik^2;
the terms' mean square is sum_k ||x_:k||^2 ||W_:k||^2 / (M N). So a massive activation channel
weighs the weight's error in that channel, and the input's error elsewhere is weighed by the weight
columns that read it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import Node
from preclint.reference.analyses import ForwardAnalysis
from preclint.core.numerics import E5M2, MODES, SCALED_MODES

if TYPE_CHECKING:
    import torch


@dataclass
class OperandQuantisation:
    """One operand (the activation "input", or the "weight") under one recipe."""

    amax: float  # of the whole tensor
    groups: int  # the groups that share a scale (1 tensorwise; rows; blocks)
    zero_groups: int  # groups whose amax is 0: scale max/0, inf unless the recipe floors amax
    scale_range: Tuple[float, float]  # the smallest and largest finite encoding scale picked
    saturated: float  # fraction of elements beyond the element format's largest value after scaling
    underflow: float  # fraction of the nonzero elements that become 0
    subnormal: float  # fraction of the nonzero elements that land among the element format's subnormals
    # across groups: (min, median, p99) of each group's fraction of underflowing / subnormal elements
    group_underflow: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    group_subnormal: Tuple[float, float, float] = (0.0, 0.0, 0.0)
    sqnr_db: float = float("inf")  # 10 log10(sum x^2 / sum (q(x) - x)^2); inf where exact
    dot_error: float = 0.0  # relative RMS error of the layer's dot products from this operand, to their terms
    nonfinite: bool = False  # quantising gives inf/NaN (a group's scale is inf)
    # groups whose amax is nonzero but below the recipe's floor (amax-epsilon): the floor, not their
    # values, sets their scale
    floored_groups: int = 0


@dataclass
class ScaledOperands:
    """Per scaled mode (numerics.SCALED_MODES): the layer's operands as its recipe quantises them, or
    why the recipe does not convert the layer (``rejected``)."""

    modes: Dict[str, Dict[str, OperandQuantisation]] = field(default_factory=dict)
    rejected: Dict[str, str] = field(default_factory=dict)
    # |x| per input channel (the reduction dimension): max over the channel, and the median of the
    # channels' RMS, which say whether one channel dominates the tensor's amax
    channel_absmax: Tuple[float, ...] = ()
    channel_rms_median: float = 0.0
    # the input under the fp8 (tensorwise) recipe with E5M2 elements: what the wider range keeps
    input_e5m2: Optional[OperandQuantisation] = None

    def combined(self, mode: str) -> Optional[float]:
        """The relative RMS error of the dot products from both operands' quantisation under ``mode``."""
        operands = self.modes.get(mode)
        if not operands:
            return None
        x, w = operands["input"], operands["weight"]
        if x.nonfinite or w.nonfinite:
            return float("inf")
        return (x.dot_error**2 + w.dot_error**2 + (x.dot_error * w.dot_error) ** 2) ** 0.5


class ScaledOperandsAnalysis(ForwardAnalysis):
    record = ScaledOperands

    def observe(self, node: Node, call: Call) -> None:
        import torch

        callee = call.callee
        if type(callee) is not torch.nn.Linear or not call.args or not isinstance(call.args[0], torch.Tensor):
            return
        x = call.args[0].detach()
        if not x.is_floating_point() or x.numel() == 0 or x.shape[-1] != callee.in_features:
            return
        node.put(scaled_operands(x, callee.weight.detach()))


def scaled_operands(x: torch.Tensor, weight: torch.Tensor) -> ScaledOperands:
    """The record of a linear layer reading ``x`` (..., K) with ``weight`` (N x K)."""
    import torch

    # autocast hands the layer a bfloat16 input; the weight is quantised from its float32 master copy
    x2 = x.reshape(-1, x.shape[-1]).float().to(torch.bfloat16).float()
    w = weight.float()
    channel_rms = x2.double().pow(2).mean(dim=0).sqrt()  # (in float64: a square of 1e19 and more overflows float32)
    record = ScaledOperands(channel_absmax=tuple(float(v) for v in x2.abs().amax(dim=0)),
                            channel_rms_median=float(channel_rms.median()))
    x_original = x.reshape(-1, x.shape[-1]).double()
    a2 = x_original.pow(2).sum(dim=0)  # per input channel k: sum_i x_ik^2
    w2 = w.double().pow(2).sum(dim=0)  # sum_j W_jk^2
    terms = float((a2 * w2).sum())
    for mode in SCALED_MODES:
        recipe = MODES[mode].recipe
        reason = recipe.rejects(weight.shape[1], weight.shape[0])
        if reason is not None:
            record.rejected[mode] = reason
        if recipe.granularity == "block" and weight.shape[1] % recipe.block:
            continue  # K falls into no whole blocks: nothing to describe (the rejection says why)
        # (a layer the recipe rejects is still described: the rules say what its conversion would do)
        q_x = _describe(x2, x_original, recipe, w2, terms)
        q_w = _describe(w, w.double(), recipe, a2, terms)
        record.modes[mode] = {"input": q_x, "weight": q_w}
    from dataclasses import replace

    if "fp8" in MODES and MODES["fp8"].recipe is not None:
        record.input_e5m2 = _describe(x2, x_original, replace(MODES["fp8"].recipe, element=E5M2), w2, terms)
    return record


def _fractions(mask: torch.Tensor, of: torch.Tensor) -> Tuple[float, float, float]:
    """(min, median, p99) over groups of the fraction of each group's ``of`` elements in ``mask``."""
    import torch

    counts = of.sum(dim=1).double()
    fraction = torch.where(counts > 0, (mask & of).sum(dim=1).double() / counts.clamp_min(1), torch.zeros_like(counts))
    if fraction.numel() == 1:
        value = float(fraction[0])
        return value, value, value
    return (float(fraction.min()), float(fraction.median()), float(torch.quantile(fraction, 0.99)))


def _floored(amax: torch.Tensor, recipe) -> int:
    """The groups whose scale the recipe's amax floor sets instead of their nonzero amax: those below
    it where each group's scale is max/amax (fp32 scales), every group where NVFP4's tensor amax is
    below it (its tensor scale is floored); E8M0 scales read no floor."""
    if recipe.scale == "e8m0" or recipe.amax_epsilon <= 0:
        return 0
    if recipe.scale == "e4m3":
        tensor_amax = float(amax.max())
        return int((amax > 0).sum()) if 0 < tensor_amax < recipe.amax_epsilon else 0
    return int(((amax > 0) & (amax < recipe.amax_epsilon)).sum())


def _describe(values: torch.Tensor, original: torch.Tensor, recipe, other_energy: torch.Tensor,
              terms: float) -> OperandQuantisation:
    """One operand (rows x K) quantised by ``recipe``, against ``original`` (float64, before the
    bfloat16 rounding): ``other_energy`` per k weighs its error in the dot products."""
    import math

    import torch

    from preclint.measure.scaled import Quantised  # lazy: the plain check loads no probe/measure/plan

    quantised = Quantised(values, recipe)
    element = recipe.element
    nonzero = quantised.groups != 0
    q = quantised.values
    nonfinite = not bool(torch.isfinite(q).all())
    underflow = nonzero & (q == 0)
    subnormal = nonzero & (q != 0) & (quantised.scaled.abs() < element.min_normal)
    saturated = quantised.scaled.abs() > element.max_finite * (1 + 2.0**-20)
    scales = quantised.scale[torch.isfinite(quantised.scale)]
    n_nonzero = max(int(nonzero.sum()), 1)
    error = (q.reshape(original.shape).double() - original) if not nonfinite else None
    signal = float(original.pow(2).sum())
    noise = float(error.pow(2).sum()) if error is not None else math.inf
    sqnr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal > 0 and math.isfinite(noise) else -math.inf)
    dot = math.inf
    if error is not None:
        weighted = float((error.pow(2).sum(dim=0) * other_energy).sum())
        dot = math.sqrt(weighted / terms) if terms > 0 else 0.0
    return OperandQuantisation(
        amax=float(quantised.amax.max()), groups=int(quantised.amax.numel()),
        zero_groups=int((quantised.amax == 0).sum()),
        floored_groups=_floored(quantised.amax, recipe),
        scale_range=(float(scales.min()), float(scales.max())) if scales.numel() else (math.inf, math.inf),
        saturated=float(saturated.sum()) / quantised.groups.numel(),
        underflow=float(underflow.sum()) / n_nonzero, subnormal=float(subnormal.sum()) / n_nonzero,
        group_underflow=_fractions(underflow, nonzero), group_subnormal=_fractions(subnormal, nonzero),
        sqnr_db=sqnr, dot_error=dot, nonfinite=nonfinite)
