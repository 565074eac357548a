"""Scaled GEMMs (FP8 tensorwise and rowwise, MXFP8, NVFP4): each operand quantised per a
numerics.Recipe, then the product, run two ways.

* Emulated (any device): float32 math. Each operand is quantised and dequantised exactly as the
  recipe stores it (scale from amax, saturating rounding to the element format, the scale's own
  format), then multiplied in float32 and the result rounded to bfloat16. This is what the kernels
  compute up to the order and width of their sums (Hopper's FP8 tensor cores accumulate with fewer
  bits than float32 under ``use_fast_accum``).
* ``torch._scaled_mm`` (real FP8 on a GPU with FP8 tensor cores; CPU kernels exist too): tensorwise
  and rowwise only. ``scaled_mm_operands`` builds its arguments: the FP8 activation (row-major, M x K)
  and weight (column-major, K x N), and the decoding scales (1/scale: a scalar, or M x 1 and 1 x N).

The activation is quantised from bfloat16 (autocast hands Float8Linear a bfloat16 input), the weight
from its float32 master copy, as torchao's Float8Linear does at inference.
"""
from __future__ import annotations

import contextlib
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from preclint.core.numerics import E4M3, Format, Recipe

_FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def round_element(x: torch.Tensor, fmt: Format) -> torch.Tensor:
    """float32 ``x`` rounded to ``fmt`` (nearest even, saturating at its largest value, subnormals kept),
    in float32 math: the same grid as float8_e4m3fn/float8_e5m2 casts and FP4 (E2M1)."""
    mantissa_bits = round(-torch.log2(torch.tensor(fmt.unit_roundoff)).item()) - 1
    a = x.abs().clamp(max=fmt.max_finite)
    min_exponent = int(torch.log2(torch.tensor(fmt.min_normal)).item())
    exponent = torch.floor(torch.log2(a.clamp_min(fmt.min_subnormal / 4))).clamp_min(min_exponent)
    quantum = torch.exp2(exponent - mantissa_bits)
    q = torch.round(a / quantum) * quantum  # torch.round ties to even
    return torch.copysign(q.clamp(max=fmt.max_finite), x)


def round_stochastic(x: torch.Tensor, fmt: Format, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """float32 ``x`` rounded to ``fmt``'s grid stochastically: up to the next grid value with probability
    (distance from the one below) / (the grid's step there), so that the expected result is ``x``
    (saturating at the largest value); a value below the smallest subnormal becomes 0 or it."""
    mantissa_bits = round(-torch.log2(torch.tensor(fmt.unit_roundoff)).item()) - 1
    a = x.abs().clamp(max=fmt.max_finite)
    min_exponent = int(torch.log2(torch.tensor(fmt.min_normal)).item())
    exponent = torch.floor(torch.log2(a.clamp_min(fmt.min_subnormal / 4))).clamp_min(min_exponent)
    quantum = torch.exp2(exponent - mantissa_bits)
    below = torch.floor(a / quantum) * quantum
    draw = torch.rand(a.shape, generator=generator, device=a.device) if generator is not None else torch.rand_like(a)
    q = below + quantum * (draw < (a - below) / quantum)
    return torch.copysign(q.clamp(max=fmt.max_finite), x)


def _groups(x: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """``x`` (..., K) viewed as the groups that share one scale: (groups, elements)."""
    if recipe.granularity == "tensor":
        return x.reshape(1, -1)
    if recipe.granularity == "row":
        return x.reshape(-1, x.shape[-1])
    return x.reshape(-1, recipe.block)


def group_amax(x: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """amax of each group of ``x`` that shares a scale (one column: groups x 1), in float64."""
    return _groups(x.detach(), recipe).abs().amax(dim=1, keepdim=True).double()


def encoding_scale(amax: torch.Tensor, recipe: Recipe, tensor_amax: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The factor each group is multiplied by before rounding to the element format (float32;
    inf where amax is 0 and the recipe does not floor it). NVFP4 (``scale == "e4m3"``): the block
    scale rounded to E4M3, times the fp32 tensor scale, inverted."""
    element = recipe.element
    if recipe.scale == "fp32":
        scale = (element.max_finite / amax.clamp_min(recipe.amax_epsilon)).float()
        if recipe.power_of_two:
            scale = torch.exp2(torch.floor(torch.log2(scale)))
        return scale
    if recipe.scale == "e8m0":
        # OCP MX: shared exponent floor(log2(amax)) - emax of the element (8 for E4M3), in E8M0's range
        emax = int(torch.floor(torch.log2(torch.tensor(element.max_finite))).item())
        exponent = torch.floor(torch.log2(amax.clamp_min(2.0**-127))) - emax
        return torch.exp2(-exponent.clamp(-127, 127)).float()
    # NVFP4: decode = e4m3(block_amax / 6 / tensor_scale) * tensor_scale, tensor_scale = amax / (448 * 6)
    tensor_amax = amax.max() if tensor_amax is None else tensor_amax
    tensor_scale = (tensor_amax.clamp_min(recipe.amax_epsilon or 2.0**-126) / (E4M3.max_finite * element.max_finite)).float()
    # (an all-zero block gets E4M3's smallest normal scale, as torchao's NVFP4 clamps it; an
    # unfloored recipe, amax-epsilon 0 with no tensor amax, leaves 0 and 0 * inf)
    block_scale = round_element((amax / element.max_finite / tensor_scale).float(), E4M3)
    if recipe.amax_epsilon > 0:
        block_scale = block_scale.clamp_min(E4M3.min_normal)
    decode = block_scale * tensor_scale
    return torch.where(decode > 0, 1.0 / decode, torch.full_like(decode, float("inf")))


class Quantised:
    """One operand quantised per a recipe, group by group (groups x elements, float32): the values,
    each group's amax (float64) and encoding scale, the scaled values before rounding, and the values
    the GEMM reads (scaled, rounded to the element format, scaled back). A stochastic recipe draws its
    rounding from ``generator``."""

    def __init__(self, x: torch.Tensor, recipe: Recipe, generator: Optional[torch.Generator] = None) -> None:
        self.groups = _groups(x.detach().float(), recipe)
        self.amax = self.groups.abs().amax(dim=1, keepdim=True).double()
        self.scale = encoding_scale(self.amax, recipe)
        self.scaled = self.groups * self.scale
        rounded = round_stochastic(self.scaled, recipe.element, generator) if recipe.stochastic else \
            round_element(self.scaled, recipe.element)
        self.values = rounded / self.scale


def quantise(x: torch.Tensor, recipe: Recipe) -> torch.Tensor:
    """``x`` (..., K, float32) as the scaled GEMM reads it: scaled per group, rounded to the element
    format, scaled back (float32). A group whose scale is infinite (amax 0, no floor) gives NaN, as
    0 * inf does in the kernels' casts."""
    return Quantised(x, recipe).values.reshape(x.shape)


def emulated_linear(x: torch.Tensor, weight_q: torch.Tensor, bias: Optional[torch.Tensor],
                    recipe: Recipe) -> torch.Tensor:
    """The scaled GEMM of ``x`` (float, ..., K) with an already quantised weight, emulated: the
    activation rounded to bfloat16 and quantised, float32 products and sums, the bias added before
    the result is rounded to bfloat16 (as _scaled_mm's epilogue). Returns float32 holding bfloat16 values."""
    xq = quantise(x.float().to(torch.bfloat16).float(), recipe)
    with _autocast_off(x.device.type):
        bias32 = bias.to(torch.bfloat16).float() if bias is not None else None
        y = F.linear(xq, weight_q.float(), bias32)
    return y.to(torch.bfloat16).float()


def scaled_mm_operands(x2: torch.Tensor, weight: torch.Tensor, recipe: Recipe
                       ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The arguments of ``torch._scaled_mm`` for ``x2`` (M x K, bfloat16) times ``weight.T`` (weight:
    N x K, float32): the FP8 activation (M x K, row-major), the FP8 weight as a column-major K x N,
    and their decoding scales (scalars for tensorwise; M x 1 and 1 x N for rowwise), float32."""
    if recipe.granularity not in ("tensor", "row") or recipe.scale != "fp32":
        raise ValueError(f"torch._scaled_mm runs tensorwise and rowwise FP8, not {recipe.granularity} {recipe.scale}")
    if x2.dim() != 2 or weight.dim() != 2 or x2.shape[1] != weight.shape[1]:
        raise ValueError(f"shapes {tuple(x2.shape)} and {tuple(weight.shape)} do not multiply as x @ W.T")
    reason = recipe.rejects(weight.shape[1], weight.shape[0])
    if reason is not None:
        raise ValueError(f"torch._scaled_mm rejects this layer: {reason}")
    dtype = _FP8_DTYPES[recipe.element.name]
    limit = recipe.element.max_finite

    def to_fp8(t: torch.Tensor):
        t = t.float()
        scale = encoding_scale(group_amax(t, recipe), recipe)
        scale = scale.reshape(()) if recipe.granularity == "tensor" else scale.reshape(-1, 1)
        return (t * scale).clamp(-limit, limit).to(dtype), scale

    a, scale_x = to_fp8(x2)
    w, scale_w = to_fp8(weight)
    b = w.t()  # N x K row-major is K x N column-major, the layout _scaled_mm takes for its second operand
    decode_b = scale_w.reciprocal() if recipe.granularity == "tensor" else scale_w.reciprocal().reshape(1, -1)
    return a, b, scale_x.reciprocal(), decode_b


def scaled_mm_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], recipe: Recipe) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` as one ``torch._scaled_mm``: bfloat16 out."""
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).to(torch.bfloat16)
    a, b, scale_a, scale_b = scaled_mm_operands(x2, weight, recipe)
    y = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b,
                         bias=bias.to(torch.bfloat16) if bias is not None else None,
                         out_dtype=torch.bfloat16, use_fast_accum=recipe.fast_accum)
    return y.reshape(*shape[:-1], weight.shape[0])


def hardware_fp8(device: torch.device) -> bool:
    """Whether ``device`` has FP8 tensor cores (compute capability 8.9 or later)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


class ScaledLinear(torch.nn.Linear):
    """An nn.Linear whose product runs as the recipe's scaled GEMM: ``backend`` "emulated" or
    "scaled_mm". It keeps the layer's float32 weight (a copy's parameters map to the model's by
    name) and holds the quantised weight beside it. ``native``: a bfloat16 result, as autocast
    gives (a native run); else float32 holding bfloat16 values (an emulated one)."""

    def __init__(self, linear: torch.nn.Linear, recipe: Recipe, backend: str, native: bool) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.recipe, self.backend, self.native = recipe, backend, native
        with torch.no_grad():
            self.weight_q = quantise(linear.weight.detach().float(), recipe) if backend == "emulated" else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.backend == "scaled_mm":
            y = scaled_mm_linear(x, self.weight.detach(), self.bias, self.recipe)
            return y if self.native else y.float()
        y = emulated_linear(x, self.weight_q, self.bias, self.recipe)
        return y.to(torch.bfloat16) if self.native else y

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self.backend}: {self.recipe.describe()}"


def converts(module: torch.nn.Module, recipe: Recipe) -> bool:
    """Whether torchao's conversion would take this module: an nn.Linear (exactly, not a subclass
    with its own forward) whose in and out features the recipe accepts."""
    return type(module) is torch.nn.Linear and recipe.rejects(module.in_features, module.out_features) is None


@contextlib.contextmanager
def _autocast_off(device_type: str):
    with torch.autocast(device_type if device_type in ("cuda", "cpu") else "cpu", enabled=False):
        yield


def gemm_backend(recipe: Recipe, device: torch.device, emulated: bool) -> str:
    """How a mode's scaled GEMMs run: "scaled_mm" on a GPU with FP8 tensor cores for the recipes
    torch._scaled_mm takes, else "emulated" (the CPU, MX and NVFP4 on Hopper, --emulate)."""
    return "scaled_mm" if not emulated and recipe.hardware == "scaled_mm" and hardware_fp8(device) else "emulated"


def convert_linears(model: torch.nn.Module, recipe: Recipe, backend: str, native: bool,
                    inside: Optional[set] = None) -> list:
    """Replace, in ``model`` (a copy), each nn.Linear the recipe converts (among the modules whose
    ids are in ``inside``, where given) with a ScaledLinear; the paths replaced."""
    replaced = []
    for path, module in list(model.named_modules()):
        if path and converts(module, recipe) and not recipe.keeps(path) and (inside is None or id(module) in inside):
            model.set_submodule(path, ScaledLinear(module, recipe, backend, native))
            replaced.append(path)
    return replaced


def describe_scaled(name: str, recipe: Recipe, backend: str, converted: Optional[int] = None) -> str:
    """One line for the report: how a scaled mode ran."""
    layers = "nn.Linear layers" if converted is None else f"{converted} nn.Linear layer(s)"
    rule = f"in/out features multiples of {recipe.multiple}" + (f", K a multiple of {recipe.block}" if recipe.block else "")
    if backend == "scaled_mm":
        how = "hardware: real FP8 GEMMs through torch._scaled_mm, bfloat16 out"
    else:
        how = ("emulated: input (from bfloat16) and weight quantised and dequantised per the recipe, "
               "float32 GEMM, bfloat16 out")
    return f"{name}: {layers} with {rule} as scaled GEMMs ({recipe.describe()}); {how}; the rest under bfloat16 autocast"
