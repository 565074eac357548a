"""Number formats, precision modes and which dtype each op computes in under each mode.

The facts here are the ones docs/error-model.md states (measured on an H200 or read from PyTorch's
autocast source); the error model that uses them lives in predict.py.
"""
from __future__ import annotations

import contextlib
import fnmatch
import math
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Iterator, Mapping, Optional, Tuple

from preclint.core.ir import Kind


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

# The element formats of scaled GEMMs (research/peers-3.md, section 5): never a storage format of a
# whole value, so not in FORMATS; a Recipe scales each operand into one of them.
E4M3 = Format("e4m3", 2.0**-4, 448.0, 2.0**-6, 2.0**-9, 16)  # float8_e4m3fn: no inf, overflow is NaN
E5M2 = Format("e5m2", 2.0**-3, 57344.0, 2.0**-14, 2.0**-16, 8)  # float8_e5m2
E2M1 = Format("e2m1", 2.0**-2, 6.0, 1.0, 0.5, 4)  # FP4: {0, 0.5, 1, 1.5, 2, 3, 4, 6}
ELEMENT_FORMATS = {f.name: f for f in (E4M3, E5M2, E2M1)}


@dataclass(frozen=True)
class Recipe:
    """How a scaled GEMM quantises its two operands (the activation, per token, and the weight, per
    output feature), with torchao's defaults (torchao/float8/config.py, float8_utils.py):

    * ``granularity``: "tensor" (one scale per tensor), "row" (one per row of the activation and per
      output feature of the weight) or "block" (one per ``block`` elements along the reduction);
    * ``element``: the format the scaled values are rounded to (saturating at its largest value);
    * ``scale``: how a scale is stored: "fp32" (max/amax), "e8m0" (a power of two, OCP MX: the
      largest with amax / scale <= 2^emax of the element) or "e4m3" (NVFP4: an E4M3 block scale
      times an fp32 tensor scale of amax / (448 * 6));
    * ``power_of_two``: fp32 scales rounded down to a power of two (torchao's rowwise default);
    * ``amax_epsilon``: the floor of amax before the division (torchao's EPS; 0 leaves 448/0 = inf);
    * ``fast_accum``: ``use_fast_accum`` of the forward GEMM (torchao: True for the output GEMM);
    * ``multiple``: the in and out features a converted nn.Linear must be multiples of;
    * ``amax_history``: 0, current scaling (this step's amax); N > 0, Transformer Engine's DelayedScaling
      in a training step: one scale per tensor, max / the largest amax of the last N steps, 1.0 on a first
      step (a fresh history), margin 0;
    * ``stochastic``: the scaled values rounded stochastically (to either neighbour on the element grid,
      the nearer one the likelier, unbiased), as NVFP4 training rounds its gradients; else to nearest even.
    """

    granularity: str
    element: Format
    block: int = 0
    scale: str = "fp32"
    power_of_two: bool = False
    amax_epsilon: float = 1e-12
    fast_accum: bool = True
    multiple: int = 16
    hardware: str = "scaled_mm"  # what runs it on an H200: "scaled_mm" (real FP8), or "emulated"
    keep: Tuple[str, ...] = ()  # module paths (globs) that stay in bfloat16 (torchao's module_filter_fn)
    stochastic: bool = False
    amax_history: int = 0

    def keeps(self, path: str) -> bool:
        """Whether the layer at ``path`` stays in bfloat16 by the configuration."""
        return any(fnmatch.fnmatchcase(path, pattern) for pattern in self.keep)

    def rejects(self, in_features: int, out_features: int) -> Optional[str]:
        """Why a linear layer of these sizes does not convert (a kernel's shape rule), or None."""
        if in_features % self.multiple or out_features % self.multiple:
            return f"in/out features {in_features}x{out_features} are not multiples of {self.multiple}"
        if self.block and in_features % self.block:
            return f"the reduction K = {in_features} is not a multiple of the block of {self.block}"
        return None

    def describe(self) -> str:
        if self.granularity == "block":
            scale = {"e8m0": "a power-of-two (E8M0) scale", "e4m3": "an E4M3 scale and an fp32 tensor scale"}[self.scale]
            return f"{self.element.name.upper()} elements, {scale} per {self.block} along K"
        scale = "power-of-two " if self.power_of_two else ""
        return (f"{self.element.name.upper()}, one {scale}fp32 scale {self.element.max_finite:g}/amax per "
                f"{'tensor' if self.granularity == 'tensor' else 'row'}, amax floored at {self.amax_epsilon:g}, "
                f"use_fast_accum={self.fast_accum}")


@dataclass(frozen=True)
class Exports:
    """How the tools that deploy a format name it, for a plan's exports (None: the tool has no such
    format): torchao's recipe (``Float8LinearConfig.from_recipe_name``), ModelOpt's config (``mtq.*_CFG``)
    and its quantizers' attributes (``{"weight": ..., "input": ...}``, as its *_CFG entries set them),
    and Transformer Engine's recipe class."""

    torchao: Optional[str] = None
    modelopt: Optional[str] = None
    # nested dicts, so left out of the hash (a Mode stays hashable) but compared
    modelopt_quantizers: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    transformer_engine: Optional[str] = None


@dataclass(frozen=True)
class Mode:
    """A precision a user targets.

    ``dot_format`` is the format a conv/matmul rounds its inputs to; ``low`` the reduced storage
    format (None when values stay fp32); ``autocast`` whether only autocast's lists run in ``low``
    (True) or the whole model is cast (False). ``floor``: float32 itself is the precision judged
    (against float64): every float32 result and accumulation rounds at 2^-24, which the other modes
    take as exact, and nothing needs emulating (float32 kernels run as they are on every device).
    """

    name: str
    dot_format: Format
    low: Optional[Format]
    autocast: bool
    description: str
    # a scaled-GEMM mode: the nn.Linear layers the recipe accepts run as scaled GEMMs, the rest of the
    # model under bf16 autocast (None: no scaled GEMMs)
    recipe: Optional[Recipe] = None
    floor: bool = False
    # tf32 only: the dot products whose kernel is the backend's choice (core/kernels.py) predicted in
    # float32 instead of TF32, for the prediction's second figure
    backend_float32: bool = False
    # bits a value takes stored in the format, its share of the scales counted (None: not a storage
    # format): ``preclint plan --formats`` lists formats cheapest first by it
    bits_per_element: Optional[float] = None
    exports: Exports = Exports()
    # the kinds of layer (ir.Kind) the deployment backends run no kernel of in this format: they stay
    # in bfloat16 (PCL109)
    unsupported: Tuple[str, ...] = ()

    @property
    def rounds_products_only(self) -> bool:
        """Only the dot products round (their operands, to ``dot_format``, inside the kernel); every
        value is stored in float32 (TF32: natively the cuDNN and cuBLAS switch, no cast and no autocast)."""
        return self.low is None and not self.floor and self.recipe is None

    @property
    def kernel_choice_matters(self) -> bool:
        """Whether a dot product's rounding depends on the kernel the backend picks for its shape: where
        the rounding happens inside the kernel, a float32 kernel rounds nothing (core/kernels.py)."""
        return self.rounds_products_only


# ModelOpt's num_bits of E4M3 (exponent, mantissa bits). The layers a format has no kernels for in
# the backends that deploy it (``unsupported``): TensorRT runs no NVFP4 convolution ("TensorRT does
# not support NVFP4 for convolution operations", NVIDIA/Model-Optimizer #362, research/peers-3.md
# 1.1); torchao's MX and NVFP4 recipes convert nn.Linear only.
_E4M3_BITS = (4, 3)
MODES: Dict[str, Mode] = {
    m.name: m
    for m in (
        Mode("fp32", FP32, None, False, "fp32 model with TF32 off: float32's own rounding, against float64",
             floor=True, bits_per_element=32.0),
        Mode("tf32", TF32, None, False, "fp32 model with TF32 convolutions and matmuls", bits_per_element=32.0),
        Mode("fp16", FP16, FP16, True, "torch.autocast(dtype=torch.float16)", bits_per_element=16.0),
        Mode("bf16", BF16, BF16, True, "torch.autocast(dtype=torch.bfloat16)", bits_per_element=16.0),
        Mode("fp16-full", FP16, FP16, False, "the whole model cast to float16 (.half(), FP16 engines)", bits_per_element=16.0),
        Mode("bf16-full", BF16, BF16, False, "the whole model cast to bfloat16", bits_per_element=16.0),
        Mode("fp8", E4M3, BF16, True, "FP8 linear layers (torchao Float8Linear, tensorwise), bf16 autocast elsewhere",
             Recipe("tensor", E4M3), bits_per_element=8.0,
             exports=Exports("tensorwise", "FP8_DEFAULT_CFG",
                             {"weight": {"num_bits": _E4M3_BITS, "axis": None},
                              "input": {"num_bits": _E4M3_BITS, "axis": None}}, "Float8CurrentScaling")),
        # a scale per row: a little above tensorwise's 8, so that the plan lists fp8 first
        Mode("fp8-rowwise", E4M3, BF16, True, "FP8 linear layers (torchao Float8Linear, rowwise), bf16 autocast "
             "elsewhere", Recipe("row", E4M3, power_of_two=True), bits_per_element=8.0 + 1e-3,
             exports=Exports("rowwise", "FP8_PER_CHANNEL_PER_TOKEN_CFG",
                             {"weight": {"num_bits": _E4M3_BITS, "axis": 0},
                              "input": {"num_bits": _E4M3_BITS, "type": "dynamic", "block_sizes": {-1: None}}})),
        Mode("mxfp8", E4M3, BF16, True, "MXFP8 linear layers (E4M3, E8M0 scale per 32), bf16 autocast elsewhere",
             Recipe("block", E4M3, block=32, scale="e8m0", amax_epsilon=0.0, multiple=16, hardware="emulated"),
             bits_per_element=8 + 8 / 32,
             exports=Exports(None, "MXFP8_DEFAULT_CFG",
                             {side: {"num_bits": _E4M3_BITS, "block_sizes": {-1: 32, "type": "dynamic", "scale_bits": (8, 0)}}
                              for side in ("weight", "input")}, "MXFP8BlockScaling"),
             unsupported=(Kind.CONV,)),
        Mode("nvfp4", E2M1, BF16, True, "NVFP4 linear layers (E2M1, E4M3 scale per 16, fp32 tensor scale), bf16 "
             "autocast elsewhere", Recipe("block", E2M1, block=16, scale="e4m3", multiple=16, hardware="emulated"),
             bits_per_element=4 + 8 / 16,
             exports=Exports(None, "NVFP4_DEFAULT_CFG",
                             {side: {"num_bits": (2, 1), "block_sizes": {-1: 16, "type": "dynamic", "scale_bits": _E4M3_BITS},
                                     "axis": None} for side in ("weight", "input")}, "NVFP4BlockScaling"),
             unsupported=(Kind.CONV,)),
    )
}
# The modes whose dot products run as scaled GEMMs (the FP8 and block-scaled formats).
SCALED_MODES: Tuple[str, ...] = tuple(name for name, mode in MODES.items() if mode.recipe is not None)

# The recipe choices users make differently ([tool.preclint.scaling], --scaling KEY=VALUE): option ->
# (Recipe field, the modes it applies to, what it takes). The defaults are torchao's (Recipe).
SCALING_OPTIONS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "format": ("element", ("fp8", "fp8-rowwise", "mxfp8"), "e4m3 or e5m2"),
    "power-of-two": ("power_of_two", ("fp8", "fp8-rowwise"), "true or false"),
    "amax-epsilon": ("amax_epsilon", SCALED_MODES, "a number >= 0"),
    "fast-accum": ("fast_accum", ("fp8", "fp8-rowwise"), "true or false"),
    "keep": ("keep", SCALED_MODES, "module paths (globs) kept in bfloat16"),
    "amax-history": ("amax_history", ("fp8",), "a whole number >= 0 (0: current scaling; N: delayed scaling over "
                     "N steps, training only)"),
}


def scaling_value(option: str, value: Any) -> Any:
    """``value`` of scaling option ``option`` as its Recipe field holds it; ValueError where it is not one."""
    if option not in SCALING_OPTIONS:
        raise ValueError(f"unknown scaling option {option!r} (known: {', '.join(SCALING_OPTIONS)})")
    field_name, _, takes = SCALING_OPTIONS[option]
    if field_name == "element":
        if value not in ("e4m3", "e5m2"):
            raise ValueError(f"scaling {option} takes {takes}, not {value!r}")
        return ELEMENT_FORMATS[value]
    if field_name in ("power_of_two", "fast_accum"):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            value = value.lower() == "true"
        if not isinstance(value, bool):
            raise ValueError(f"scaling {option} takes {takes}, not {value!r}")
        return value
    if field_name == "amax_history":
        number = value if isinstance(value, int) and not isinstance(value, bool) else \
            int(value) if isinstance(value, str) and value.strip().isdigit() else -1
        if number < 0:
            raise ValueError(f"scaling {option} takes {takes}, not {value!r}")
        return number
    if field_name == "amax_epsilon":
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"scaling {option} takes {takes}, not {value!r}")
        return number
    patterns = [value] if isinstance(value, str) else value
    if not isinstance(patterns, (list, tuple)) or not all(isinstance(p, str) for p in patterns):
        raise ValueError(f"scaling {option} takes {takes}, not {value!r}")
    return tuple(p for part in patterns for p in part.split(",") if p)


def scaled_mode(name: str, options: Mapping[str, Any]) -> Mode:
    """Mode ``name`` with the scaling ``options`` that apply to it."""
    mode = MODES[name]
    changes = {SCALING_OPTIONS[k][0]: scaling_value(k, v) for k, v in options.items() if name in SCALING_OPTIONS[k][1]}
    return replace(mode, recipe=replace(mode.recipe, **changes)) if changes and mode.recipe is not None else mode


@contextlib.contextmanager
def scaled_recipes(options: Optional[Mapping[str, Any]]) -> Iterator[None]:
    """The scaled modes of the mode table with ``options`` applied, while the block runs (one model's
    walk reads its modes by name, MODES[name], in every stage)."""
    if not options:
        yield
        return
    saved = {name: MODES[name] for name in SCALED_MODES}
    try:
        for name in SCALED_MODES:
            MODES[name] = scaled_mode(name, options)
        yield
    finally:
        MODES.update(saved)
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
# CUDA autocast runs cuDNN's RNNs (nn.LSTM, nn.GRU, nn.RNN; not the cells) in float16 whatever its
# dtype: the autocast wrapper of _cudnn_rnn casts weights, input and states to half
# (aten/src/ATen/cudnn/AutocastRNN.cpp). On an H100, Resemblyzer's trained LSTM under bfloat16 autocast
# measured 4.5e-3, near its float16 figure (2.6e-3), not its bfloat16-full one (0.0174).
CUDNN_RNNS = frozenset({"lstm", "gru", "rnn"})
CUDNN_RNN_AUTOCAST = "fp16"
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


def autocast_lowered(fn: str, low: Format) -> Format:
    """The format autocast runs a 'lower' op ``fn`` in where it lowers to ``low``: ``low``, except for
    cuDNN's RNNs, which run in float16 under any autocast dtype (CUDNN_RNNS)."""
    return FORMATS[CUDNN_RNN_AUTOCAST] if fn in CUDNN_RNNS else low


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
