"""The flushes of a scaled-GEMM training step (measure/scaled_training.py), applied to the float64
reference backward, and the scale statistics of each converted layer's operands.

At each converted linear layer, the gradient arriving at its output (after the flushes downstream of it)
is quantised as the recipe quantises it for ``dx = g W``, along N, and its values that become 0 are set
to 0 in the float64 backward: the gradients of everything before the layer see them flushed. The
layer's weight gradient is recomputed from the same arriving gradient quantised along M, as ``dW = g^T x``
reads it, and its bias gradient from the arriving gradient unquantised. Only the flushes are modelled;
the rounding to the element formats is the error model's (predict/training.py).

Under ``nvfp4`` the gradients round stochastically: a value below the element's smallest subnormal s (after
scaling) becomes 0 with probability 1 - |v|/s and s otherwise (its expectation kept), a draw made once here
from a seeded generator (the run draws its own); and the weight gradient is the product of the arriving
gradient and the input both rotated along M by the random Hadamard transform (measure/nvfp4_training.py),
the gradient's flushes drawn on the rotated values.

Under a delayed-scaling recipe (``fp8`` with ``amax_history``) the step predicted is a run's first: every
operand's scale is a fresh history's 1.0 (what a later step's would be needs the steps before it; ``--probe
--steps N`` measures them).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict

import torch

from preclint.measure.grouped import quantise_along
from preclint.measure.scaled_training import converted_paths, recipes, weight_statistics
from preclint.measure.scale_statistics import delayed_statistics, scale_statistics
from preclint.measure.scaled import round_element
from preclint.measure.nvfp4_training import rotated

FIRST_SCALE = 1.0  # a delayed-scaling recipe's scale before any amax is recorded (Transformer Engine's)


def _flushed(g: torch.Tensor, recipe, dim: int, generator=None) -> torch.Tensor:
    """``g`` with the values the recipe makes 0 set to 0 (a delayed-scaling recipe: at its first step's scale)."""
    if recipe.amax_history:
        q = round_element(g.float() * FIRST_SCALE, recipe.element)
        return torch.where((q == 0) & (g != 0), torch.zeros_like(g), g)
    return _flushed_with(g, recipe, dim, generator)


def _flushed_with(g: torch.Tensor, recipe, dim: int, generator=None) -> torch.Tensor:
    """``g`` (rows x N, float64) with the values ``recipe`` quantises to 0 along ``dim`` set to 0 (a
    stochastic recipe: drawn from ``generator``, the survivors below the smallest subnormal raised to it)."""
    if not recipe.stochastic:
        q = quantise_along(g, recipe, dim).values
        return torch.where((q == 0) & (g != 0), torch.zeros_like(g), g)
    q = quantise_along(g, replace(recipe, stochastic=False), dim)
    smallest = recipe.element.min_subnormal
    scaled = q.scaled.abs().double()
    below = (scaled < smallest) & (g != 0)
    draw = torch.rand(g.shape, generator=generator, dtype=torch.float64).to(g.device)  # (a CPU generator)
    raised = torch.copysign(smallest * g.abs() / scaled.clamp_min(1e-300), g)  # s / scale, scale = |scaled| / |g|
    return torch.where(below, torch.where(draw < scaled / smallest, raised, torch.zeros_like(g)), g)


class ScaledFlushes:
    """The hooks (``transforms``, module path -> a function of its output's gradient) for _Backward.flushed,
    then ``weight_gradients`` to finish the flushed gradients; ``statistics`` per converted layer."""

    def __init__(self, request, backward, mode: str) -> None:
        self.mode = mode
        self.forward_recipe, self.gradient_recipe = recipes(mode)
        self.generator = torch.Generator().manual_seed(0)  # a stochastic recipe's flushes, drawn once
        self.backward = backward
        self.paths = [path for path in converted_paths(request.model, mode)
                      if path in backward.inputs and backward.outputs.get(path)]
        self.arriving: Dict[str, torch.Tensor] = {}
        self.transforms = {path: self._transform(path) for path in self.paths}
        self.statistics: Dict[str, Dict[str, dict]] = {}

    def _transform(self, path: str):
        def transform(grad: torch.Tensor) -> torch.Tensor:
            self.arriving[path] = grad.detach()
            g2 = grad.reshape(-1, grad.shape[-1])
            return _flushed(g2, self.gradient_recipe, -1, self.generator).reshape(grad.shape)

        return transform

    def _statistics(self, values: torch.Tensor, recipe, weight: bool = False) -> dict:
        if recipe.amax_history:
            return delayed_statistics(values, recipe, FIRST_SCALE)
        return weight_statistics(values, self.mode, recipe) if weight else scale_statistics(values, recipe)

    def weight_gradients(self, flushed: Dict[str, torch.Tensor]) -> None:
        """Each converted layer's weight and bias gradient in ``flushed`` (parameter -> gradient) as the
        layer's backward computes them from its arriving gradient; the layers' statistics."""
        modules = dict(self.backward.model.named_modules())
        for path in self.paths:
            grad = self.arriving.get(path)
            module = modules[path]
            x2 = self.backward.inputs[path].reshape(-1, module.in_features).double()
            weight = module.weight.detach().double()
            stats = {"input": self._statistics(x2, self.forward_recipe),
                     "weight": self._statistics(weight, self.forward_recipe, weight=True)}
            if grad is not None:
                g2 = grad.reshape(-1, module.out_features).double()
                stats["grad_output"] = self._statistics(g2, self.gradient_recipe)
                g_wgrad, x_wgrad = g2, x2
                if self.mode == "nvfp4":
                    g_wgrad, x_wgrad = rotated(g2), rotated(x2)
                    stats["grad_output_wgrad"] = scale_statistics(g_wgrad, self.gradient_recipe, 0)
                prefix = f"{path}." if path else ""
                if prefix + "weight" in flushed:
                    flushed[prefix + "weight"] = _flushed(g_wgrad, self.gradient_recipe, 0, self.generator).t() @ x_wgrad
                if module.bias is not None and prefix + "bias" in flushed:
                    flushed[prefix + "bias"] = g2.sum(dim=0)
            self.statistics[path] = stats
