"""Number formats, precision modes and which dtype each op computes in under each mode.

The facts here are the ones docs/error-model.md states (measured on an H200 or read from PyTorch's
autocast source); the error model that uses them lives in predict.py.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Format:
    name: str
    unit_roundoff: float  # u = 2^-(mantissa bits + 1)
    max_finite: float
    min_normal: float
    min_subnormal: float  # 0.0 where the format keeps no subnormals worth modelling
    exact_integers_to: int


FP32 = Format("fp32", 2.0**-24, 3.4028234663852886e38, 1.1754943508222875e-38, 1.401298464324817e-45, 2**24)
TF32 = Format("tf32", 2.0**-11, FP32.max_finite, FP32.min_normal, FP32.min_subnormal, 2**11)
FP16 = Format("fp16", 2.0**-11, 65504.0, 2.0**-14, 2.0**-24, 2**11)
BF16 = Format("bf16", 2.0**-8, 3.3895313892515355e38, 1.1754943508222875e-38, 9.183549615799121e-41, 2**8)

FORMATS = {f.name: f for f in (FP32, TF32, FP16, BF16)}


@dataclass(frozen=True)
class Mode:
    """A precision a user targets.

    ``dot_format`` is the format a conv/matmul rounds its inputs to; ``low`` the reduced storage
    format (None when values stay fp32); ``autocast`` whether only autocast's lists run in ``low``
    (True) or the whole model is cast (False).
    """

    name: str
    dot_format: Format
    low: Optional[Format]
    autocast: bool
    description: str
    # tf32 only: the dot products whose kernel is the backend's choice (core/kernels.py) predicted in
    # float32 instead of TF32, for the prediction's second figure
    backend_float32: bool = False


MODES: Dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("tf32", TF32, None, False, "fp32 model with TF32 convolutions and matmuls"),
        Mode("fp16", FP16, FP16, True, "torch.autocast(dtype=torch.float16)"),
        Mode("bf16", BF16, BF16, True, "torch.autocast(dtype=torch.bfloat16)"),
        Mode("fp16-full", FP16, FP16, False, "the whole model cast to float16 (.half(), FP16 engines)"),
        Mode("bf16-full", BF16, BF16, False, "the whole model cast to bfloat16"),
    )
}
DEFAULT_MODES: Tuple[str, ...] = ("tf32", "fp16", "bf16")

# Constants of the error model (docs/error-model.md): rounding two operands gives u*sqrt(2/3) in
# theory, 0.6*u is used; rounding a result to a format gives 0.42*u in RMS over many elements. With them
# the predicted output errors lie within 3x of those measured on an H200 for 115 of 118 zoo and example
# (model, mode) pairs (benchmarks/CLAIMS.md).
C_INPUT = 0.6
C_OUTPUT = 0.42

# Autocast op lists (aten/src/ATen/autocast_mode.h, CUDA), by canonical op name (Node.fn).
AUTOCAST_LOWER = frozenset(
    """conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution conv_tbc
    prelu addmm addmv addr matmul einsum mm mv linear addbmm baddbmm bmm chain_matmul linalg_vecdot
    scaled_dot_product_attention multi_head_attention lstm gru rnn lstm_cell gru_cell""".split()
)
AUTOCAST_FP32 = frozenset(
    """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus
    layer_norm group_norm norm frobenius_norm nuclear_norm cosine_similarity normalize poisson_nll_loss
    cosine_embedding_loss nll_loss hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss
    mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss
    multi_margin_loss binary_cross_entropy_with_logits cross_entropy dist pdist cdist renorm logsumexp
    prod softmax log_softmax cumprod cumsum sum vector_norm matrix_norm interpolate upsample
    upsample_nearest upsample_bilinear grid_sample nms batched_nms roi_align roi_pool""".split()
)
AUTOCAST_PROMOTE = frozenset(
    "addcdiv addcmul atan2 bilinear cross dot vdot index_put tensordot scatter_add cat stack".split()
)
# Batch norms that autocast does not list run in their input's dtype: batch_norm's mixed-dtype kernels
# read float32 weights and statistics and store the activation's dtype. These leaf modules compute
# ``x * scale + bias`` from float32 buffers instead (torchvision's and timm's FrozenBatchNorm2d), so
# type promotion stores their result in float32 under autocast.
PROMOTING_BATCHNORMS = frozenset({"FrozenBatchNorm2d"})


def autocast_format(region, mode: Mode) -> Optional[Format]:
    """The format autocast lowers its listed ops to at a node inside ``region`` (an
    ir.AutocastRegion the model's code set, or None) under ``mode``; None where autocast is off there.

    ``torch.autocast(enabled=False)`` and a ``custom_fwd(cast_inputs=...)`` forward turn it off; an
    enabled region lowers to its own dtype, or to the enclosing one's (CUDA's default, float16,
    when nothing encloses it), whatever the mode: a model that enables autocast itself gets it under
    tf32 and the -full modes too."""
    if region is None:
        return mode.low if mode.autocast else None
    if not region.enabled or region.cast_inputs is not None:
        return None
    if region.dtype is not None:
        return FORMATS.get(DTYPE_FORMATS.get(region.dtype, ""), FP16)
    return autocast_format(region.outer, mode) or FP16


def casting_region(region, mode: Mode):
    """The innermost ``custom_fwd(cast_inputs=...)`` forward around a node (an ir.AutocastRegion)
    whose cast takes effect under ``mode``, which is where autocast is on around the forward; else None."""
    while region is not None and region.cast_inputs is None:
        region = region.outer
    return region if region is not None and autocast_format(region.outer, mode) is not None else None


# format -> how messages name it: the torch dtype a value in it is stored as (TF32 is no storage dtype)
DTYPE_NAMES = {"fp32": "float32", "tf32": "TF32", "fp16": "float16", "bf16": "bfloat16"}
# torch dtype names -> the format a value of that dtype is stored in (float64 counts as float32: no
# precision mode rounds it)
DTYPE_FORMATS = {**{dtype: fmt for fmt, dtype in DTYPE_NAMES.items() if fmt != "tf32"},
                 "half": "fp16", "float": "fp32", "float64": "fp32", "double": "fp32"}


def dtype_name(fmt: str) -> str:
    """How a message names format ``fmt`` (a Format.name): float16, bfloat16, TF32, ..."""
    return DTYPE_NAMES.get(fmt, fmt)


def autocast_policy(fn: str) -> str:
    """'lower', 'fp32', 'promote' or 'input' (runs in the dtype of its inputs)."""
    if fn in AUTOCAST_LOWER:
        return "lower"
    if fn in AUTOCAST_FP32:
        return "fp32"
    if fn in AUTOCAST_PROMOTE:
        return "promote"
    return "input"


def representable(value: float, fmt: Format) -> str:
    """How ``value`` survives conversion to ``fmt``: 'exact-range', 'subnormal', 'zero' or 'overflow'."""
    a = abs(value)
    if a == 0 or math.isnan(a):
        return "exact-range"
    if a > fmt.max_finite * (1 + fmt.unit_roundoff):
        return "overflow"
    if fmt.min_subnormal and a < fmt.min_subnormal / 2:
        return "zero"
    if a < fmt.min_normal:
        return "subnormal"
    return "exact-range"


def round_to(value: float, fmt: Format) -> float:
    """``value`` rounded to ``fmt`` (round to nearest even), without torch."""
    if value == 0 or math.isinf(value) or math.isnan(value):
        return value
    a = abs(value)
    if a >= fmt.max_finite * (1 + fmt.unit_roundoff):
        return math.copysign(math.inf, value)
    mantissa_bits = round(-math.log2(fmt.unit_roundoff)) - 1
    exponent = max(math.floor(math.log2(a)), math.floor(math.log2(fmt.min_normal)))
    quantum = 2.0 ** (exponent - mantissa_bits)
    return math.copysign(round(a / quantum) * quantum, value)


def gaussian_max_factor(n: int) -> float:
    """Expected max |z| over n standard normal draws, ~ sqrt(2 ln n): turns an RMS error into a max."""
    if n <= 1:
        return 1.0
    return math.sqrt(2.0 * math.log(n))
