"""The gradient error of piecewise-linear ops whose kink the forward's rounding crosses.

A ReLU passes its output's gradient where its input is above 0 and nothing below: where a precision's
forward moves an input across 0, the backward takes or drops that element's whole gradient term, an
error far above the rounding of the term itself (its share of the gradient error grows like sqrt(u)
rather than u, as the density of inputs within the forward's error of 0 does). The same holds at every
kink of leaky_relu (its slope's jump), hardtanh, relu6 and clamp with constant bounds.

From a float64 forward of a copy, the kinks' inputs and their outputs' gradients are kept. Per precision,
the forward's absolute error at each kink's input comes from a second float64 forward in which every
dot product (linear, convolution, matmul) carries the rounding of its operands, C_INPUT * u times the
RMS of its terms, as Gaussian noise (the error model's per-GEMM figure, NUMERICS.md) carried on by the
model's own ops. An input at distance d of a kink crosses it with probability Phi(-d / sigma), sigma the
RMS of that error over the kink's input; its expected squared gradient error is that probability times
(the jump x its output's gradient)^2. Those errors, with independent signs, are carried back to the
parameters in one backward of the float64 graph: each parameter's mask error, relative to its float64
gradient's norm (predict/training.py adds it to the rounding floor in quadrature).

Not modelled: max-pool's and max's selection between near-equal candidates; kinks of functions whose
bounds are tensors; in-place variants run out of place in these two forwards only.
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from preclint.core.numerics import C_INPUT

# dot products whose operands a low precision rounds: the function -> the same op on two operands' squares
_GEMMS = {F.linear: lambda a, b, *rest, **kw: F.linear(a, b),
          torch.matmul: lambda a, b, **kw: torch.matmul(a, b), torch.Tensor.matmul: lambda a, b: torch.matmul(a, b),
          torch.Tensor.__matmul__: lambda a, b: torch.matmul(a, b), torch.mm: lambda a, b, **kw: torch.mm(a, b),
          torch.bmm: lambda a, b, **kw: torch.bmm(a, b),
          torch.addmm: lambda c, a, b, **kw: torch.mm(a, b), torch.baddbmm: lambda c, a, b, **kw: torch.bmm(a, b)}
for _conv in (F.conv1d, F.conv2d, F.conv3d):
    _GEMMS[_conv] = (lambda conv: lambda x, w, bias=None, *rest, **kw: conv(x, w, None, *rest, **kw))(_conv)


def _bounds(func, args, kwargs) -> Optional[Tuple[Tuple[float, ...], float, object]]:
    """(the kink points, the derivative's jump there, the out-of-place op) of a kink function call, or None."""
    if func in (F.relu, torch.relu, torch.relu_, F.relu_, torch.Tensor.relu, torch.Tensor.relu_):
        return (0.0,), 1.0, torch.relu
    if func in (F.leaky_relu, F.leaky_relu_):
        slope = float(args[1] if len(args) > 1 else kwargs.get("negative_slope", 0.01))
        return (0.0,), abs(1.0 - slope), lambda x: F.leaky_relu(x, slope)
    if func is F.relu6:
        return (0.0, 6.0), 1.0, lambda x: F.hardtanh(x, 0.0, 6.0)
    if func in (F.hardtanh, F.hardtanh_):
        low = float(args[1] if len(args) > 1 else kwargs.get("min_val", -1.0))
        high = float(args[2] if len(args) > 2 else kwargs.get("max_val", 1.0))
        return (low, high), 1.0, lambda x: F.hardtanh(x, low, high)
    if func in (torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip, torch.clamp_, torch.Tensor.clamp_):
        low = args[1] if len(args) > 1 else kwargs.get("min")
        high = args[2] if len(args) > 2 else kwargs.get("max")
        if any(isinstance(b, torch.Tensor) for b in (low, high)):
            return None
        points = tuple(float(b) for b in (low, high) if b is not None)
        return (points, 1.0, lambda x: torch.clamp(x, low, high)) if points else None
    return None


class _Kinks(TorchFunctionMode):
    """Records each kink call's input (and output); with ``noise``, adds each dot product's operand rounding."""

    def __init__(self, noise: float = 0.0, generator: Optional[torch.Generator] = None) -> None:
        super().__init__()
        self.noise, self.generator = noise, generator
        self.sites: List[Tuple[torch.Tensor, torch.Tensor, Tuple[float, ...], float]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        found = _bounds(func, args, kwargs) if args and isinstance(args[0], torch.Tensor) else None
        if found is not None and args[0].is_floating_point():
            points, jump, op = found
            out = op(args[0])
            self.sites.append((args[0], out, points, jump))
            return out
        out = func(*args, **kwargs)
        if self.noise > 0 and func in _GEMMS and isinstance(out, torch.Tensor) and out.is_floating_point():
            operands = [a for a in args if isinstance(a, torch.Tensor)]
            squares = [a.detach() ** 2 if isinstance(a, torch.Tensor) else a for a in args]
            try:
                terms = _GEMMS[func](*squares, **kwargs).clamp_min(0).sqrt()
            except (TypeError, RuntimeError):  # a call form the squares cannot repeat: no noise there
                return out
            if terms.shape == out.shape and len(operands) >= 2:
                noise = torch.randn(out.shape, dtype=out.dtype, generator=self.generator, device=out.device)
                out = out + noise * (self.noise * terms)
        return out


def mask_errors(request, units: Dict[str, float], grads: Dict[str, torch.Tensor]) -> Dict[str, Dict[str, float]]:
    """Per precision (``units``: mode -> the unit roundoff of its forward's dot products), each parameter's
    gradient error from the kinks its forward crosses, relative to its float64 gradient in ``grads``."""
    from preclint.measure.training_step import loss_of, prepared  # lazy: the plain check loads no probe/measure/plan

    model, inputs, targets = prepared(request, "float64")
    params = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    recorder = _Kinks()
    torch.manual_seed(request.seed)
    with torch.enable_grad(), recorder:
        loss = loss_of(request.step.output(model, inputs), targets, request.step.loss_fn, request.step.label)
    sites = [s for s in recorder.sites if s[0].requires_grad and s[1].requires_grad]
    if not sites or not params:
        return {mode: {} for mode in units}
    upstream = torch.autograd.grad(loss, [s[1] for s in sites], retain_graph=True, allow_unused=True)
    out: Dict[str, Dict[str, float]] = {}
    for i, (mode, u) in enumerate(units.items()):
        errors = _forward_errors(request, (model, inputs), recorder.sites, C_INPUT * u, seed=request.seed + 1 + i)
        if errors is None:
            out[mode] = {}
            continue
        kept = [e for s, e in zip(recorder.sites, errors) if s[0].requires_grad and s[1].requires_grad]
        generator = torch.Generator().manual_seed(request.seed)
        injected = []
        for (z, _, points, jump), sigma, g in zip(sites, kept, upstream):
            g = torch.zeros_like(z) if g is None else g
            distance = torch.stack([(z.detach() - p).abs() for p in points]).amin(0)
            crossing = 0.5 * torch.special.erfc(distance / (max(sigma, 1e-300) * math.sqrt(2.0)))
            signs = torch.randint(0, 2, z.shape, generator=generator).to(z.dtype) * 2 - 1
            injected.append(signs * crossing.sqrt() * jump * g)
        moved = torch.autograd.grad([s[0] for s in sites], [p for _, p in params], injected, retain_graph=True,
                                    allow_unused=True)
        out[mode] = {}
        for (name, _), d in zip(params, moved):
            norm = float(grads[name].double().norm()) if name in grads else 0.0
            if d is not None and norm > 0:
                out[mode][name] = float(d.double().norm()) / norm
    return out


def _forward_errors(request, call, plain, noise: float, seed: int) -> Optional[List[float]]:
    """The RMS absolute error at each kink's input (in call order; ``plain``: the float64 forward's sites)
    of a forward whose dot products carry their operands' rounding (``noise``: its relative size)."""
    model, inputs = call
    noisy = _Kinks(noise, torch.Generator().manual_seed(seed))
    torch.manual_seed(request.seed)  # the same dropout masks as the plain forward
    with torch.no_grad(), noisy:
        request.step.output(model, inputs)
    if len(noisy.sites) != len(plain) or any(a[0].shape != b[0].shape for a, b in zip(plain, noisy.sites)):
        return None
    return [float((b[0] - a[0].detach()).double().pow(2).mean().sqrt()) if a[0].numel() else 0.0
            for a, b in zip(plain, noisy.sites)]
