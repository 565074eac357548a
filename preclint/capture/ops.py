"""Classify what a model calls (a leaf module, a torch function, a tensor method) into IR terms.

Both capture paths (FX and the function-mode fallback) name the same thing the same way here, so
rules see one vocabulary: a Kind and a canonical op name (``Node.fn``).
"""
from __future__ import annotations

import math
import operator
from typing import Any, Dict, Optional, Tuple

from preclint.core.ir import Kind

# Reductions that add their terms up (a running sum included): the reference pass records their
# lengths, and the predictions their accumulation error.
SUMS = frozenset({"sum", "mean", "nansum", "nanmean", "cumsum"})
# Leaf modules that are not in torch.nn but must stay one node (their insides are one op to users).
EXTRA_LEAF_MODULES = frozenset({"FrozenBatchNorm2d"})

_MODULE_KINDS: Dict[str, Tuple[str, str]] = {}


def _register_modules(kind: str, fn: str, names: str) -> None:
    for name in names.split():
        _MODULE_KINDS[name] = (kind, fn)


_register_modules(Kind.CONV, "conv1d", "Conv1d LazyConv1d")
_register_modules(Kind.CONV, "conv2d", "Conv2d LazyConv2d")
_register_modules(Kind.CONV, "conv3d", "Conv3d LazyConv3d")
_register_modules(Kind.CONV, "conv_transpose1d", "ConvTranspose1d")
_register_modules(Kind.CONV, "conv_transpose2d", "ConvTranspose2d")
_register_modules(Kind.CONV, "conv_transpose3d", "ConvTranspose3d")
_register_modules(Kind.LINEAR, "linear", "Linear LazyLinear NonDynamicallyQuantizableLinear")
_register_modules(Kind.LINEAR, "bilinear", "Bilinear")
_register_modules(Kind.MATMUL, "multi_head_attention", "MultiheadAttention")
_register_modules(Kind.MATMUL, "lstm", "LSTM")
_register_modules(Kind.MATMUL, "gru", "GRU")
_register_modules(Kind.MATMUL, "rnn", "RNN")
_register_modules(Kind.BATCHNORM, "batch_norm", "BatchNorm1d BatchNorm2d BatchNorm3d SyncBatchNorm FrozenBatchNorm2d")
_register_modules(Kind.NORM, "layer_norm", "LayerNorm")
_register_modules(Kind.NORM, "group_norm", "GroupNorm")
_register_modules(Kind.NORM, "instance_norm", "InstanceNorm1d InstanceNorm2d InstanceNorm3d")
_register_modules(Kind.NORM, "rms_norm", "RMSNorm")
_register_modules(Kind.NORM, "local_response_norm", "LocalResponseNorm")
_register_modules(Kind.SOFTMAX, "softmax", "Softmax Softmax2d")
_register_modules(Kind.SOFTMAX, "log_softmax", "LogSoftmax")
for _name, _fn in {
    "ReLU": "relu", "ReLU6": "relu6", "GELU": "gelu", "SiLU": "silu", "Sigmoid": "sigmoid", "Tanh": "tanh",
    "Hardswish": "hardswish", "Hardsigmoid": "hardsigmoid", "LeakyReLU": "leaky_relu", "ELU": "elu",
    "SELU": "selu", "CELU": "celu", "Mish": "mish", "Softplus": "softplus", "PReLU": "prelu",
    "Hardtanh": "hardtanh", "GLU": "glu", "Softsign": "softsign", "Tanhshrink": "tanhshrink",
}.items():
    _MODULE_KINDS[_name] = (Kind.ACTIVATION, _fn)
_register_modules(Kind.POOL, "max_pool", "MaxPool1d MaxPool2d MaxPool3d AdaptiveMaxPool1d AdaptiveMaxPool2d AdaptiveMaxPool3d")
_register_modules(Kind.POOL, "avg_pool", "AvgPool1d AvgPool2d AvgPool3d AdaptiveAvgPool1d AdaptiveAvgPool2d AdaptiveAvgPool3d")
_register_modules(Kind.RESAMPLE, "interpolate", "Upsample UpsamplingNearest2d UpsamplingBilinear2d PixelShuffle")
_register_modules(Kind.SHAPE, "identity", "Identity Dropout Dropout1d Dropout2d Dropout3d AlphaDropout Flatten Unflatten")
_register_modules(Kind.OTHER, "embedding", "Embedding EmbeddingBag")

_FUNCTION_KINDS: Dict[str, str] = {}


def _register_functions(kind: str, names: str) -> None:
    for name in names.split():
        _FUNCTION_KINDS[name] = kind


_register_functions(Kind.CONV, "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution")
_register_functions(Kind.LINEAR, "linear addmm bilinear")
_register_functions(Kind.MATMUL, "matmul mm bmm baddbmm einsum mv scaled_dot_product_attention tensordot dot")
_register_functions(Kind.BATCHNORM, "batch_norm")
_register_functions(Kind.NORM, "layer_norm group_norm instance_norm rms_norm normalize local_response_norm")
_register_functions(Kind.SOFTMAX, "softmax log_softmax")
_register_functions(Kind.REDUCTION, "sum mean var std var_mean std_mean prod norm logsumexp amax amin nansum nanmean vector_norm")
_register_functions(Kind.SCAN, "cumsum cumprod logcumsumexp cummax cummin")
_register_functions(Kind.DECISION, "argmax argmin topk sort argsort nms batched_nms kthvalue unique msort")
_register_functions(Kind.COMPARE, "gt lt ge le eq ne greater less greater_equal less_equal isclose")
_register_functions(
    Kind.ACTIVATION,
    "relu relu6 gelu silu sigmoid tanh hardswish hardsigmoid leaky_relu elu selu celu mish softplus prelu hardtanh glu",
)
_register_functions(
    Kind.ELEMENTWISE,
    """add sub mul div truediv floordiv true_divide floor_divide pow exp exp2 expm1 log log2 log10 log1p sqrt
    rsqrt reciprocal neg abs clamp clamp_min clamp_max clip where masked_fill addcmul addcdiv square sin cos
    tan atan atan2 sinh cosh erf erfinv sign lerp fmod remainder maximum minimum rsub radd iadd isub imul
    idiv itruediv matmul_scalar baddbmm_scalar""",
)
_register_functions(Kind.CAST, "float half bfloat16 double to type type_as long int short bool round floor ceil trunc")
_register_functions(
    Kind.CONSTANT,
    "arange zeros ones full empty zeros_like ones_like full_like empty_like tensor rand randn randint linspace new_zeros new_ones new_full new_tensor new_empty",
)
_register_functions(Kind.RESAMPLE, "interpolate upsample grid_sample affine_grid roi_align roi_pool ps_roi_align")
_register_functions(
    Kind.POOL,
    "max_pool1d max_pool2d max_pool3d avg_pool1d avg_pool2d avg_pool3d adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d adaptive_max_pool1d adaptive_max_pool2d adaptive_max_pool3d",
)
_register_functions(
    Kind.SHAPE,
    """view reshape permute transpose flatten unflatten cat concat stack getitem setitem split chunk squeeze
    unsqueeze expand expand_as contiguous repeat narrow select index_select gather t flip roll clone detach
    dropout getattr unbind movedim swapaxes pad tile repeat_interleave masked_select nonzero index scatter
    view_as reshape_as broadcast_to cpu cuda split_with_sizes""",
)

_OPERATOR_NAMES = {
    operator.add: "add", operator.sub: "sub", operator.mul: "mul", operator.truediv: "div",
    operator.floordiv: "floordiv", operator.pow: "pow", operator.neg: "neg", operator.matmul: "matmul",
    operator.getitem: "getitem", operator.setitem: "setitem", operator.gt: "gt", operator.lt: "lt",
    operator.ge: "ge", operator.le: "le", operator.eq: "eq", operator.ne: "ne", operator.iadd: "add",
    operator.isub: "sub", operator.imul: "mul", operator.itruediv: "div", operator.mod: "fmod",
    operator.abs: "abs", operator.and_: "and", operator.or_: "or", operator.invert: "not",
}
INPLACE_OPERATORS = {operator.iadd: operator.add, operator.isub: operator.sub, operator.imul: operator.mul,
                     operator.itruediv: operator.truediv}

_DUNDER = {"__add__": "add", "__radd__": "add", "__iadd__": "add", "__sub__": "sub", "__rsub__": "rsub",
           "__isub__": "sub", "__mul__": "mul", "__rmul__": "mul", "__imul__": "mul", "__truediv__": "div",
           "__rtruediv__": "div", "__itruediv__": "div", "__div__": "div", "__pow__": "pow", "__rpow__": "pow",
           "__matmul__": "matmul", "__rmatmul__": "matmul", "__neg__": "neg", "__abs__": "abs",
           "__getitem__": "getitem", "__setitem__": "setitem", "__gt__": "gt", "__lt__": "lt", "__ge__": "ge",
           "__le__": "le", "__eq__": "eq", "__ne__": "ne", "__floordiv__": "floordiv", "__mod__": "fmod",
           "__and__": "and", "__or__": "or", "__invert__": "not", "__rdiv__": "div"}


def is_leaf_module(module) -> bool:
    import torch

    name = type(module).__name__
    if name in EXTRA_LEAF_MODULES:
        return True
    if isinstance(module, (torch.nn.Sequential, torch.nn.ModuleList, torch.nn.ModuleDict)):
        return False
    mod = type(module).__module__
    return mod.startswith("torch.nn") or mod.startswith("torch.ao.nn")


def classify_module(module) -> Tuple[str, str]:
    """(kind, fn) of a leaf module, by its class or the nearest known base class; a quantized module
    is no float op of its kind (no precision mode changes its int8 arithmetic): ``quantized_linear``."""
    # (imported here: this module is read by torch-free analyses; a module to classify means torch is in)
    from preclint.load.model_classes import is_quantized_module  # lazy: torch-free path

    if is_quantized_module(module):
        return Kind.OTHER, "quantized_" + type(module).__name__.lower()
    for cls in type(module).__mro__:
        if cls.__name__ in _MODULE_KINDS:
            return _MODULE_KINDS[cls.__name__]
    return Kind.OTHER, type(module).__name__.lower()


def function_name(target: Any) -> Tuple[str, bool]:
    """Canonical op name of a function or method target, and whether the call is in-place."""
    if target in _OPERATOR_NAMES:
        return _OPERATOR_NAMES[target], target in INPLACE_OPERATORS
    # an aten overload (torch.ops.aten.conv2d.default, in exported and converted graphs) is named
    # by its op, not its overload
    name = target if isinstance(target, str) else getattr(target, "_opname", None) or getattr(target, "__name__", str(target))
    if name in _DUNDER:
        return _DUNDER[name], name.startswith("__i")
    inplace = False
    if name.endswith("_") and not name.startswith("_") and name[:-1] in _FUNCTION_KINDS:
        name, inplace = name[:-1], True
    name = name.lstrip("_") if name.lstrip("_") in _FUNCTION_KINDS else name
    return name, inplace


def classify_function(fn: str) -> str:
    return _FUNCTION_KINDS.get(fn, Kind.OTHER)


def module_attrs(module) -> Dict[str, Any]:
    """The attributes of a leaf module that rules read (plain Python values only)."""
    attrs: Dict[str, Any] = {}
    for key in ("groups", "kernel_size", "stride", "padding", "dilation", "in_channels", "out_channels",
                "in_features", "out_features", "eps", "normalized_shape", "num_groups", "dim", "inplace",
                "embed_dim", "num_heads", "momentum", "affine", "track_running_stats", "mode", "scale_factor"):
        value = getattr(module, key, None)
        if value is None or callable(value):
            continue
        if isinstance(value, (int, float, bool, str)):
            attrs[key] = value
        elif isinstance(value, (tuple, list)) and all(isinstance(v, (int, float)) for v in value):
            attrs[key] = tuple(value)
    return attrs


def reduction_length(kind: str, fn: str, attrs: Dict[str, Any], in_shapes, out_shape) -> Optional[int]:
    """K of a dot product (products summed per output), or N of a reduction, scan or softmax."""
    if kind == Kind.CONV:
        if "in_channels" in attrs and "kernel_size" in attrs:
            return attrs["in_channels"] // max(1, attrs.get("groups", 1)) * math.prod(attrs["kernel_size"])
        if len(in_shapes) >= 2 and in_shapes[1]:
            weight = in_shapes[1]  # (out, in/groups, *kernel)
            return math.prod(weight[1:])
        return None
    if kind == Kind.LINEAR:
        if "in_features" in attrs:
            return attrs["in_features"]
        return in_shapes[0][-1] if in_shapes and in_shapes[0] else None
    if kind == Kind.MATMUL:
        if fn == "multi_head_attention":
            return attrs.get("embed_dim")
        return in_shapes[0][-1] if in_shapes and in_shapes[0] else None
    if kind in (Kind.REDUCTION, Kind.SCAN, Kind.SOFTMAX, Kind.NORM):
        shape = in_shapes[0] if in_shapes and in_shapes[0] is not None else None
        if shape is None:
            return None
        dims = attrs.get("dim")
        if kind == Kind.NORM and "normalized_shape" in attrs:
            return math.prod(attrs["normalized_shape"])
        if dims is None:
            if kind == Kind.SCAN or kind == Kind.SOFTMAX:
                return shape[-1] if shape else 1
            return math.prod(shape) if shape else 1
        dims = dims if isinstance(dims, (tuple, list)) else (dims,)
        try:
            return math.prod(shape[d] for d in dims)
        except (IndexError, TypeError):
            return None
    return None
