"""The terms a dot product or a sum adds up: the RMS over outputs of sqrt(sum_k (a_k b_k)^2), or
sqrt(sum_k x_k^2) for sums, means and cumulative sums. Rounding a sum errs in proportion to its terms,
not to its result, and a result far below its terms has cancelled (PCL203)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, Optional

from preclint.reference.analyses import ForwardAnalysis
from preclint.capture.observer import Call
from preclint.core.ir import DOT_PRODUCT_KINDS, Node
from preclint.capture.ops import SUMS

if TYPE_CHECKING:
    import torch

CONDITION_THRESHOLDS = (10, 100, 1000)  # Terms.condition: the fractions of outputs whose terms exceed them


@dataclass
class Terms:
    """The size of the terms a dot product or a sum adds up: the RMS over outputs of sqrt(sum_k (a_k b_k)^2)
    (sqrt(sum_k x_k^2) for a sum), against which rounding and cancellation are judged."""

    rms: float
    # t -> the fraction of outputs whose terms exceed the result t times (10, 100, 1000); dot products only
    condition: Dict[int, float] = field(default_factory=dict)


class TermsAnalysis(ForwardAnalysis):
    record = Terms

    def observe(self, node: Node, call: Call) -> None:
        if not call.outputs:
            return
        output = call.outputs[0]
        if node.kind in DOT_PRODUCT_KINDS:
            terms = dot_terms(node, call.args, call.kwargs, call.callee)
            if terms is not None and terms.shape == output.shape:
                import torch

                # (one buffer for the squares, the magnitudes and their ratio: fewer fresh allocations,
                # each of which the CPU pays for in page faults, the same values)
                squares = terms.pow(2)
                rms = float(squares.mean().sqrt())
                if not math.isfinite(rms) or (rms == 0 and bool(output.detach().ne(0).any())):
                    # a square beyond float32's range (operands near 1e19 and above) or below it: the
                    # terms of operands scaled by powers of two (exact), their mean square in float64
                    terms = dot_terms(node, call.args, call.kwargs, call.callee, scaled=True)
                    if terms is None or terms.shape != output.shape:
                        return
                    squares = terms.clone()
                    rms = float(terms.double().pow(2).mean().sqrt())
                magnitude = torch.abs(output.detach().float(), out=squares).clamp_min_(1e-30)
                ratio = torch.div(terms, magnitude, out=magnitude)
                node.put(Terms(rms, condition_fractions(ratio, scratch=terms)))
        if node.fn in SUMS and output.is_floating_point():
            terms = sum_terms(node, call.args, call.kwargs, call.callee, output)
            if terms is not None:
                y = output.detach().double().abs()
                ratio = terms / y.clamp_min(1e-300)
                node.put(Terms(float(terms.pow(2).mean().sqrt()),
                               {t: float((ratio > t).double().mean()) for t in CONDITION_THRESHOLDS}))


def condition_fractions(ratio: torch.Tensor, scratch: Optional[torch.Tensor] = None) -> Dict[int, float]:
    """t -> the fraction of ``ratio``'s elements above t, for the CONDITION_THRESHOLDS: the float32
    mean of ``ratio > t``, figure for figure, from counts read back at once. ``scratch``: a tensor of
    ``ratio``'s shape and dtype whose values may be overwritten (else one is made)."""
    import torch

    # (counting holds where the mean's float32 sum of ones is exact, below 2**24 elements, and the
    # mean is that sum divided as below, on the CPU)
    if ratio.numel() >= 2**24 or ratio.device.type != "cpu" or not ratio.is_floating_point():
        return {t: float((ratio > t).float().mean()) for t in CONDITION_THRESHOLDS}
    if scratch is None or scratch.shape != ratio.shape or scratch.dtype != ratio.dtype:
        scratch = torch.empty_like(ratio)
    # ratio > t counted as the sum of max(sign(ratio - t), 0): ratio - t is positive exactly where
    # ratio > t (the difference of two distinct floats never rounds to zero), and the float passes
    # run several times faster on the CPU than a comparison's booleans and their count. A NaN
    # (never above t) makes the sum NaN: that threshold is counted the boolean way.
    counts = []
    for t in CONDITION_THRESHOLDS:
        count = torch.sub(ratio, t, out=scratch).sign_().clamp_min_(0).sum()
        if count.isnan():
            count = torch.count_nonzero(ratio > t).to(torch.float32)
        counts.append(count)
    return dict(zip(CONDITION_THRESHOLDS, torch.stack(counts).div_(ratio.numel()).tolist()))


def dot_terms(node: Node, args, kwargs, callee, scaled: bool = False) -> Optional[torch.Tensor]:
    """sqrt(sum_k (a_k b_k)^2) per output element: the same op applied to the squared operands.
    ``scaled``: each operand scaled by a power of two that brings its largest magnitude near 1 before
    it is squared, and the result scaled back (exact: the same figures, where the squares of the
    operands as they are would overflow float32 or vanish in it)."""

    unscale = [1.0]

    def sq(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().float()
        if not scaled:
            return t.pow(2)
        factor = power_of_two_scale(t)
        unscale[0] /= factor
        return (t * factor).pow(2)

    found = _dot_terms(node, args, kwargs, callee, sq)
    if found is None or unscale[0] == 1.0:
        return found
    return found.double().mul_(unscale[0]).float()  # (float32's largest, 3.4e38, where the terms exceed it)


def power_of_two_scale(t: torch.Tensor) -> float:
    """2^-e with 2^(e-1) <= max |t| < 2^e: t times it lies within [-1, 1], exactly (1.0 where t is all
    zero or not finite)."""
    absmax = float(t.abs().max()) if t.numel() else 0.0
    if absmax == 0 or not math.isfinite(absmax):
        return 1.0
    return math.ldexp(1.0, -math.frexp(absmax)[1])


def _dot_terms(node: Node, args, kwargs, callee, sq) -> Optional[torch.Tensor]:
    import torch
    import torch.nn.functional as F

    if isinstance(callee, torch.nn.Module):
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            return None
        weight = getattr(callee, "weight", None)
        if not isinstance(weight, torch.Tensor):
            return None
        if isinstance(callee, torch.nn.modules.conv._ConvNd) and not callee.transposed:
            w2 = sq(weight)
            if callee.padding_mode != "zeros":
                return None
            conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[w2.dim() - 2]
            return conv(sq(x), w2, None, callee.stride, callee.padding, callee.dilation, callee.groups).sqrt_()
        if isinstance(callee, torch.nn.Linear):
            return F.linear(sq(x), sq(weight)).sqrt()
        return None
    fn = node.fn
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    try:
        if fn in ("conv1d", "conv2d", "conv3d") and len(tensors) >= 2:
            conv = {"conv1d": F.conv1d, "conv2d": F.conv2d, "conv3d": F.conv3d}[fn]
            rest = list(args[3:]) if len(args) > 3 else []
            kw = {k: v for k, v in kwargs.items() if k not in ("bias", "input", "weight")}
            return conv(sq(args[0]), sq(args[1]), None, *rest, **kw).sqrt()
        if fn == "linear" and len(tensors) >= 2:
            return F.linear(sq(args[0]), sq(args[1])).sqrt()
        if fn in ("matmul", "mm", "bmm") and len(tensors) == 2:
            return torch.matmul(sq(tensors[0]), sq(tensors[1])).sqrt()
        if fn in ("addmm", "baddbmm") and len(tensors) >= 3:
            return torch.matmul(sq(tensors[1]), sq(tensors[2])).sqrt()
        if fn == "einsum" and isinstance(args[0], str) and len(tensors) >= 2:
            return torch.einsum(args[0], *[sq(t) for t in tensors]).sqrt()
    except (RuntimeError, TypeError, ValueError):
        return None
    return None


def sum_terms(node: Node, args, kwargs, callee, output: torch.Tensor) -> Optional[torch.Tensor]:
    """sqrt(sum_k x_k^2) per output of a sum, mean or cumsum: the same call on the squared input."""
    import torch

    x = args[0] if args else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
        return None
    squares = x.detach().double().pow(2)
    rest = {k: v for k, v in kwargs.items() if k != "dtype"}
    try:
        if isinstance(callee, str):
            terms = getattr(squares, callee)(*args[1:], **rest)
        elif callable(callee):
            terms = callee(squares, *args[1:], **rest)
        else:
            return None
    except (RuntimeError, TypeError, ValueError):
        return None
    if not isinstance(terms, torch.Tensor) or terms.shape != output.shape:
        return None
    if node.fn in ("mean", "nanmean"):
        # mean = sum / N: its terms are x_k / N, and mean(x^2) = sum(x^2) / N
        n = max(1, x.numel() // max(1, output.numel()))
        return (terms / n).sqrt()
    return terms.sqrt()
