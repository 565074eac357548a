"""The flushes of a scaled-GEMM training step (measure/scaled_training.py), applied to the float64
reference backward, and the scale statistics of each converted layer's operands.

At each converted linear layer, the gradient arriving at its output (after the flushes downstream of it)
is quantised as the recipe quantises it for ``dx = g W``, along N, and its values that become 0 are set
to 0 in the float64 backward: the gradients of everything before the layer see them flushed. The
layer's weight gradient is recomputed from the same arriving gradient quantised along M, as ``dW = g^T x``
reads it, and its bias gradient from the arriving gradient unquantised. Only the flushes are modelled;
the rounding to the element formats is the error model's (predict/training.py).
"""
from __future__ import annotations

from typing import Dict

import torch

from preclint.measure.grouped import quantise_along
from preclint.measure.scaled_training import converted_paths, recipes
from preclint.measure.scale_statistics import scale_statistics


def _flushed(g: torch.Tensor, recipe, dim: int) -> torch.Tensor:
    """``g`` (rows x N, float64) with the values ``recipe`` quantises to 0 along ``dim`` set to 0."""
    q = quantise_along(g, recipe, dim).values
    return torch.where((q == 0) & (g != 0), torch.zeros_like(g), g)


class ScaledFlushes:
    """The hooks (``transforms``, module path -> a function of its output's gradient) for _Backward.flushed,
    then ``weight_gradients`` to finish the flushed gradients; ``statistics`` per converted layer."""

    def __init__(self, request, backward, mode: str) -> None:
        self.forward_recipe, self.gradient_recipe = recipes(mode)
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
            return _flushed(g2, self.gradient_recipe, -1).reshape(grad.shape)

        return transform

    def weight_gradients(self, flushed: Dict[str, torch.Tensor]) -> None:
        """Each converted layer's weight and bias gradient in ``flushed`` (parameter -> gradient) as the
        layer's backward computes them from its arriving gradient; the layers' statistics."""
        modules = dict(self.backward.model.named_modules())
        for path in self.paths:
            grad = self.arriving.get(path)
            module = modules[path]
            x2 = self.backward.inputs[path].reshape(-1, module.in_features).double()
            weight = module.weight.detach().double()
            stats = {"input": scale_statistics(x2, self.forward_recipe),
                     "weight": scale_statistics(weight, self.forward_recipe)}
            if grad is not None:
                g2 = grad.reshape(-1, module.out_features).double()
                stats["grad_output"] = scale_statistics(g2, self.gradient_recipe)
                prefix = f"{path}." if path else ""
                if prefix + "weight" in flushed:
                    flushed[prefix + "weight"] = _flushed(g2, self.gradient_recipe, 0).t() @ x2
                if module.bias is not None and prefix + "bias" in flushed:
                    flushed[prefix + "bias"] = g2.sum(dim=0)
            self.statistics[path] = stats
