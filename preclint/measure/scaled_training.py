"""A training step under a scaled-GEMM recipe (FP8 tensorwise and rowwise, MXFP8, NVFP4), emulated on any device.

Each nn.Linear the recipe converts (measure/scaled.py ``converts``) runs its three GEMMs as the recipe does:

- forward, ``y = x W^T``: the input (rounded to bfloat16, as autocast hands it) and the float32 master
  weight quantised along K, the reduction, with the forward recipe (E4M3);
- backward, ``dx = g W``: the output's gradient ``g`` quantised along N with the gradient recipe, the
  weight along N with the forward one;
- backward, ``dW = g^T x``: ``g`` and ``x`` quantised along M (the tokens).

Products and sums in float32, results rounded to bfloat16 (the bias's gradient is summed from ``g`` in
float32, unquantised, as torchao does). The gradient recipe is the forward's with the gradient element
format: E5M2 for ``fp8`` (Transformer Engine's HYBRID format, torchao's tensorwise default), E4M3 for
``fp8-rowwise`` (torchao's rowwise recipe) and ``mxfp8`` (Transformer Engine's MXFP8BlockScaling).
``nvfp4`` trains as NVIDIA's NVFP4 recipe (Transformer Engine's NVFP4BlockScaling): E2M1 with an E4M3
scale per 16 and an fp32 tensor scale for every operand, the weight scaled in 16 x 16 tiles, the gradients
rounded stochastically and the weight gradient's operands rotated by a random Hadamard transform along M
(measure/nvfp4_training.py).

The scales are current: each tensor's (row's, block's) amax of this step, floored at the recipe's
amax-epsilon; or, under ``fp8`` with ``amax_history`` N > 0 (Transformer Engine's DelayedScaling), one
scale per tensor from the largest amax of the layer's last N steps (1.0 on its first), each operand's
amax joining its history after it is quantised. The rest of the model runs under bfloat16 autocast,
weights and optimizer state in float32. Each converted layer keeps the statistics of
the operands it quantised (measure/scale_statistics.py) in ``statistics``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Dict

import torch
import torch.nn.functional as F

from preclint.core.numerics import E2M1, E4M3, E5M2, MODES
from preclint.measure.grouped import quantise_along
from preclint.measure.scaled import converts, round_element
from preclint.measure.scale_statistics import delayed_statistics, scale_statistics
from preclint.measure.nvfp4_training import quantise_weight_2d, rotated, tile_recipe, tiles

SCALED_TRAINING_MODES = ("fp8", "fp8-rowwise", "mxfp8", "nvfp4")
GRADIENT_ELEMENTS = {"fp8": E5M2, "fp8-rowwise": E4M3, "mxfp8": E4M3, "nvfp4": E2M1}
STOCHASTIC_GRADIENTS = ("nvfp4",)  # the recipes that round their gradients stochastically


def recipes(mode: str):
    """(the forward recipe, the gradient recipe) of scaled training mode ``mode`` (as configured now)."""
    forward = MODES[mode].recipe
    return forward, replace(forward, element=GRADIENT_ELEMENTS[mode], stochastic=mode in STOCHASTIC_GRADIENTS)


def weight_operand(w: torch.Tensor, mode: str, recipe):
    """(the weight as the forward reads it, along K; as the input's gradient reads it, along N): NVFP4's
    one 16 x 16-tiled quantisation for both, else one quantisation along each."""
    if mode == "nvfp4":
        both = quantise_weight_2d(w, recipe)
        return both, both
    return quantise_along(w, recipe).values, quantise_along(w, recipe, 0).values


def weight_statistics(w: torch.Tensor, mode: str, recipe) -> dict:
    """The weight's scale statistics as the recipe scales it (NVFP4: per 16 x 16 tile)."""
    if mode == "nvfp4":
        return scale_statistics(tiles(w), tile_recipe(recipe))
    return scale_statistics(w, recipe)


def _autocast_off(device_type: str):
    return torch.autocast(device_type if device_type in ("cuda", "cpu") else "cpu", enabled=False)


def _delayed(layer, operand: str, t: torch.Tensor, recipe, key: str, record: bool):
    """``t`` quantised at the layer's delayed scale for ``operand`` (its statistics under ``key``)."""
    scale = layer.delayed_scale(operand, t)
    read = round_element(t.float() * scale, recipe.element) / scale
    if record:
        layer.statistics[key] = delayed_statistics(t, recipe, scale, read)
    return read


class _ScaledLinearStep(torch.autograd.Function):
    """The three GEMMs of a converted layer, each on operands quantised per the recipe (module docstring)."""

    @staticmethod
    def forward(ctx, x, weight, bias, layer):
        xb = x.detach().float().to(torch.bfloat16).float()
        x2 = xb.reshape(-1, xb.shape[-1])
        w = weight.detach().float()
        if layer.forward_recipe.amax_history:  # one quantisation per tensor, read by every GEMM
            with _autocast_off(x.device.type):
                x_read = _delayed(layer, "input", x2, layer.forward_recipe, "input", layer.record)
                w_read = _delayed(layer, "weight", w, layer.forward_recipe, "weight", layer.record)
                y = F.linear(x_read, w_read, bias.detach().to(torch.bfloat16).float() if bias is not None else None)
            ctx.save_for_backward(x_read, w_read, weight)
            ctx.layer, ctx.x_shape, ctx.x_dtype, ctx.has_bias = layer, x.shape, x.dtype, bias is not None
            return y.to(torch.bfloat16).reshape(*x.shape[:-1], weight.shape[0])
        with _autocast_off(x.device.type):
            w_forward, _ = weight_operand(w, layer.mode, layer.forward_recipe)
            y = F.linear(quantise_along(x2, layer.forward_recipe).values, w_forward,
                         bias.detach().to(torch.bfloat16).float() if bias is not None else None)
        if layer.record:
            layer.statistics["input"] = scale_statistics(x2, layer.forward_recipe)
            layer.statistics["weight"] = weight_statistics(w, layer.mode, layer.forward_recipe)
        ctx.save_for_backward(x2, weight)
        ctx.layer, ctx.x_shape, ctx.x_dtype, ctx.has_bias = layer, x.shape, x.dtype, bias is not None
        return y.to(torch.bfloat16).reshape(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad):
        if ctx.layer.forward_recipe.amax_history:
            return _delayed_backward(ctx, grad)
        x2, weight = ctx.saved_tensors
        layer = ctx.layer
        forward, gradient = layer.forward_recipe, layer.gradient_recipe
        g2 = grad.detach().float().reshape(-1, weight.shape[0])
        w = weight.detach().float()
        generator = layer.generator_on(g2.device)
        with _autocast_off(g2.device.type):
            _, w_backward = weight_operand(w, layer.mode, forward)
            g_dgrad = quantise_along(g2, gradient, -1, generator).values
            g_wgrad, x_wgrad = g2, x2
            if layer.mode == "nvfp4":
                g_wgrad, x_wgrad = rotated(g2), rotated(x2)
            g_wgrad_read = quantise_along(g_wgrad, gradient, 0, generator).values
            grad_x = g_dgrad @ w_backward
            grad_w = g_wgrad_read.t() @ quantise_along(x_wgrad, forward, 0).values
        if layer.record:
            layer.statistics["grad_output"] = scale_statistics(g2, gradient, read=g_dgrad)
            if layer.mode == "nvfp4":
                layer.statistics["grad_output_wgrad"] = scale_statistics(g_wgrad, gradient, 0, read=g_wgrad_read)
        grad_x = grad_x.to(torch.bfloat16).to(ctx.x_dtype).reshape(ctx.x_shape)
        grad_b = g2.sum(dim=0).to(weight.dtype) if ctx.has_bias else None
        return grad_x, grad_w.to(torch.bfloat16).to(weight.dtype), grad_b, None


def _delayed_backward(ctx, grad):
    """The two backward GEMMs at the delayed scales: the output's gradient quantised once at its own."""
    x_read, w_read, weight = ctx.saved_tensors
    layer = ctx.layer
    g2 = grad.detach().float().reshape(-1, weight.shape[0])
    with _autocast_off(g2.device.type):
        g_read = _delayed(layer, "grad_output", g2, layer.gradient_recipe, "grad_output", layer.record)
        grad_x = g_read @ w_read
        grad_w = g_read.t() @ x_read
    grad_x = grad_x.to(torch.bfloat16).to(ctx.x_dtype).reshape(ctx.x_shape)
    grad_b = g2.sum(dim=0).to(weight.dtype) if ctx.has_bias else None
    return grad_x, grad_w.to(torch.bfloat16).to(weight.dtype), grad_b, None


class TrainingScaledLinear(torch.nn.Linear):
    """An nn.Linear that trains as its recipe's scaled GEMMs, emulated; it shares the layer's parameters
    (their names and the optimizer's view of them do not change)."""

    def __init__(self, linear: torch.nn.Linear, mode: str, record: bool = True) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.mode = mode
        self.forward_recipe, self.gradient_recipe = recipes(mode)
        self.record = record
        self.statistics: Dict[str, dict] = {}
        self.generator = None  # a stochastic recipe's draws: seeded, one stream per layer
        self.history: Dict[str, list] = {}  # a delayed-scaling recipe's amax of each operand, oldest first

    def delayed_scale(self, operand: str, t: torch.Tensor) -> float:
        """``operand``'s scale this step under delayed scaling: max / the largest amax of the last N steps
        (1.0, a fresh history's, on the first); this step's amax then joins the history."""
        recipe = self.gradient_recipe if operand == "grad_output" else self.forward_recipe
        past = self.history.setdefault(operand, [])
        amax = max(past) if past else 0.0
        scale = recipe.element.max_finite / amax if amax > 0 else 1.0
        past.append(float(t.detach().abs().max()) if t.numel() else 0.0)
        del past[:-recipe.amax_history]
        return scale

    def generator_on(self, device: torch.device):
        if not self.gradient_recipe.stochastic:
            return None
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device).manual_seed(0x5EED)
        return self.generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ScaledLinearStep.apply(x, self.weight, self.bias, self)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, forward {self.forward_recipe.describe()}; gradients "
                f"{self.gradient_recipe.element.name.upper()}")


def converted_paths(model: torch.nn.Module, mode: str):
    """The module paths of ``model`` whose nn.Linear the recipe of ``mode`` converts (not kept in bfloat16)."""
    recipe = MODES[mode].recipe
    return [path for path, module in model.named_modules()
            if path and converts(module, recipe) and not recipe.keeps(path)]


def convert_for_training(model: torch.nn.Module, mode: str) -> list:
    """Replace, in ``model`` (a copy), each linear layer ``mode``'s recipe converts; the paths replaced."""
    paths = converted_paths(model, mode)
    for path in paths:
        model.set_submodule(path, TrainingScaledLinear(model.get_submodule(path), mode))
    return paths


def recorded_statistics(model: torch.nn.Module) -> Dict[str, Dict[str, dict]]:
    """Each converted layer's statistics of its last step, by module path."""
    return {path: dict(m.statistics) for path, m in model.named_modules()
            if isinstance(m, TrainingScaledLinear) and m.statistics}
