"""How each precision mode runs on a device: natively on a GPU, or emulated.

Native (CUDA): the user's model, unmodified, under the switch a user flips:

* ``tf32``: TF32 on for cuDNN convolutions and cuBLAS matmuls;
* ``fp16``, ``bf16``: ``torch.autocast('cuda', dtype)`` (TF32 off, so each mode measures one choice);
* ``fp16-full``, ``bf16-full``: the model and its float inputs cast with ``.to(dtype)``;
* ``fp32``: the float32 model as it is, TF32 off: float32's own rounding (the floor). It runs
  natively on every device, the CPU too: float32 kernels are float32 wherever they run.

Emulated (the CPU, or any device when asked): the same arithmetic, reproduced by rounding values
and computing in float32, which is what the GPU kernels do up to the order of their sums:

* ``tf32``: the operands of every conv, linear and matmul rounded to TF32, float32 accumulation;
* ``fp16``, ``bf16``: autocast's CUDA op lists (numerics.py). A listed op rounds its operands (and
  its module's parameters) to the low format, accumulates in float32 and stores its result in the
  low format; a float32-listed op computes in float32; any other op computes in float32 from its
  (already rounded) inputs and stores its result in the dtype type promotion gives, as GPU kernels
  with float32 "opmath" do;
* ``fp16-full``, ``bf16-full``: every parameter, buffer and input rounded to the low format, every
  op computing in float32 and storing in the low format.

Where the GPU does something else (a kernel with no TF32 path, float16 accumulation) emulation and
hardware part; the report says which one it measured.

``build_mode_run`` makes the copy of the model and inputs one mode runs (runners.py says which way
it runs); the ``ModeRun`` it returns holds that copy and the mode's arithmetic, which an observer
applies op by op (the probe's sweep, or an emulated runner).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch

from preclint.capture import ops
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind
from preclint.core.kernels import FLOAT32, conv_kernel, product_kernel
from preclint.measure.recurrent import RECURRENT_TYPES, run_steps, steppable, stored_in
from preclint.load.modelio import Inputs
from preclint.core.numerics import (CUDNN_RNN_AUTOCAST, MODES, PROMOTING_BATCHNORMS, Mode, autocast_format, autocast_lowered, autocast_policy,
                                    casting_region)
from preclint.measure.backends import tf32
from preclint.measure.copies import clone_module, detached_state
from preclint.measure.rounding import LOW_DTYPES, REDUCED_FLOATS, round_tf32, round_to
from preclint.measure.scaled import convert_linears, converts, describe_scaled, gemm_backend
from preclint.capture.trees import flatten, map_tensors

# Ops whose arithmetic the emulation reproduces. The rest (data movement, casts a model asks for,
# comparisons, decisions, attribute reads such as .dtype) run as they are, on the values they get.
_EMULATED_KINDS = frozenset({
    Kind.CONV, Kind.LINEAR, Kind.MATMUL, Kind.BATCHNORM, Kind.NORM, Kind.SOFTMAX, Kind.REDUCTION, Kind.SCAN,
    Kind.ELEMENTWISE, Kind.ACTIVATION, Kind.POOL, Kind.RESAMPLE,
})

# Decisions and comparisons compute nothing a format rounds, but they read what the mode computed:
# with float16/bfloat16 operands they run on the float32 values of those operands (CPU kernels such
# as torchvision's nms have no float16 version), which decides exactly as the low format would.
_DECIDING_KINDS = frozenset({Kind.DECISION, Kind.COMPARE})

# Positions of the two multiplied operands of functional dot products (the bias is added in float32).
_OPERANDS = {
    "conv1d": (0, 1), "conv2d": (0, 1), "conv3d": (0, 1), "convolution": (0, 1),
    "conv_transpose1d": (0, 1), "conv_transpose2d": (0, 1), "conv_transpose3d": (0, 1),
    "linear": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2), "addbmm": (1, 2), "addmv": (1, 2),
}


@dataclass
class Decision:
    """What the emulation did to one call, so that its result can be stored as the mode would."""

    out_dtype: Optional[torch.dtype] = None  # cast float results to this (None: keep)
    inplace_target: Optional[torch.Tensor] = None  # write the result back here (in-place ops)
    # the operands were only widened to float32 (their values as given) and the op computes as the
    # float32 model does: its result is the float32 op's, stored as ``out_dtype`` says
    widened_only: bool = False


@dataclass
class ModeRun:
    """One precision mode on one device: the model copy it runs, its inputs, and its arithmetic."""

    name: str
    mode: Mode
    device: torch.device
    emulated: bool
    variant: torch.nn.Module  # the model as this mode runs it
    inputs: tuple
    how: str  # one line for the report
    originals: Dict[int, torch.nn.Module] = field(default_factory=dict)  # id(variant module) -> float32 module
    original_tensors: Dict[int, torch.Tensor] = field(default_factory=dict)  # id(variant param) -> float32 param
    # id(variant param) -> its reference value: the float32 parameter, which the float64 copy holds
    # exactly (cast to the mode's dtype, the two give the same operand), so that copy is not kept
    reference_tensors: Dict[int, torch.Tensor] = field(default_factory=dict)
    low_params: frozenset = frozenset()  # ids of parameters that stand for low-format values (emulated -full)
    # whether the run sets TF32 as the mode says (off but for tf32: each mode measures one choice);
    # False leaves the switches as the process has them (a plan is verified as its user deploys it)
    sets_tf32: bool = True
    only: Optional[str] = None  # the path of the one module run in the mode (the rest in float32), or None

    @property
    def low(self) -> Optional[torch.dtype]:
        return LOW_DTYPES.get(self.mode.low.name) if self.mode.low is not None else None

    # ------------------------------------------------------------------ contexts

    def context(self):
        """Entered around the whole run of this mode (and its replays); with ``only``, the run outside
        that module (float32: the native mode's switch is flipped around the module, unit_context)."""
        stack = contextlib.ExitStack()
        whole = self.only is None
        if self.sets_tf32 and (self.device.type == "cuda" or not self.emulated):
            stack.enter_context(tf32(self.mode.rounds_products_only and not self.emulated and whole))
        if whole and not self.emulated and self.mode.autocast and self.low is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.low))
        return stack

    def unit_context(self):
        """Entered around the module ``only`` names, natively: the switch a user flips for it."""
        if self.mode.rounds_products_only:
            return tf32(True)
        return torch.autocast(self.device.type, dtype=self.low)

    def exact_context(self):
        """Float32 as float32 (for the exact replays of single nodes, inside this mode's context):
        only the float16/bfloat16 modes replay exactly, and their context has TF32 off already, so
        only native autocast needs switching off. Per node, anything more would show in the time."""
        if not self.emulated and self.mode.autocast:
            return _autocast_off(self.device.type)
        if self.mode.rounds_products_only and not self.emulated:
            return tf32(False)
        return contextlib.nullcontext()

    # ------------------------------------------------------------------ emulation

    def before(self, node, args, kwargs, callee, inplace: bool = False) -> Tuple[Any, Any, Optional[Decision]]:
        """The operands as the mode's arithmetic reads them, and what to do with the result."""
        if not self.emulated:
            return args, kwargs, None
        low = self.low
        full = low is not None and not self.mode.autocast
        if full and self.low_params:
            # in a cast model the parameters an op reads as values are low-format tensors
            as_low = lambda t: t.to(low) if id(t) in self.low_params else t  # noqa: E731
            args, kwargs = _map_floats(args, as_low), _map_floats(kwargs, as_low)
        up = lambda t: t.float() if t.dtype in REDUCED_FLOATS else t  # noqa: E731
        target = _first_tensor(args) if inplace else None
        if full and isinstance(callee, torch.nn.Module) and node.kind not in (Kind.SHAPE, Kind.CAST):
            # a module of a cast model (an embedding too) computes from low-format inputs and
            # parameters and stores a low-format result; dot products round their operands first
            fn = (lambda t: _rounded_up(t, low)) if node.kind in DOT_PRODUCT_KINDS else up
            return _map_floats(args, fn), _map_floats(kwargs, fn), Decision(low, target)
        if self.mode.rounds_products_only:
            if node.kind in DOT_PRODUCT_KINDS and tf32_kernel(node, callee, args, kwargs):
                args, kwargs = _map_operands(node, callee, args, kwargs, round_tf32)
            return args, kwargs, None
        if node.kind not in _EMULATED_KINDS and node.kind not in _DECIDING_KINDS:
            return args, kwargs, None
        policy = autocast_policy(node.fn)
        casting = casting_region(node.autocast, self.mode)
        if casting is not None:  # a custom_fwd(cast_inputs=...) forward reads its float inputs in that dtype
            dtype = getattr(torch, casting.cast_inputs)
            args, kwargs = _map_floats(args, lambda t: t.to(dtype)), _map_floats(kwargs, lambda t: t.to(dtype))
        # autocast as the model's code leaves it at this op: off in its autocast(enabled=False)
        # regions, lowering to a region's own dtype
        here = autocast_format(node.autocast, self.mode)
        if here is not None:
            at = LOW_DTYPES[autocast_lowered(node.fn, here).name]  # (cuDNN's RNNs: float16)
            lowered = lambda t: _rounded_up(t, at)  # noqa: E731
            if policy == "lower" and node.kind in _EMULATED_KINDS:
                # operands already in the format only widen: the op computes as the float32 model's
                # does wherever its module's parameters are the float32 model's (probe/sweep.py checks)
                widened = casting is None and _all_floats_in(args, kwargs, at)
                return _map_floats(args, lowered), _map_floats(kwargs, lowered), Decision(at, target, widened)
            if policy == "fp32":  # torchvision's nms and roi_align too: autocast runs them in float32
                return _map_floats(args, up), _map_floats(kwargs, up), Decision(None, target, casting is None)
        elif full and (node.kind in DOT_PRODUCT_KINDS or (policy == "lower" and node.kind in _EMULATED_KINDS)):
            # -full: operands and parameters already hold low-format values; accumulate in float32
            rounded = lambda t: _rounded_up(t, low)  # noqa: E731
            return _map_floats(args, rounded), _map_floats(kwargs, rounded), Decision(low, target)
        out_dtype = _stored_dtype(node, callee, args, kwargs)
        if out_dtype not in REDUCED_FLOATS and not _any_reduced(args, kwargs):
            return args, kwargs, None
        return _map_floats(args, up), _map_floats(kwargs, up), Decision(out_dtype, target, casting is None)

    def entering(self, node, output):
        """A parameter the graph reads as a value (FX get_attr): low-format in a cast model."""
        if self.emulated and self.low is not None and not self.mode.autocast and node.fn == "parameter":
            low = self.low
            return _map_floats(output, lambda t: t.to(low))
        return output

    def after(self, output, decision: Optional[Decision], replay: bool = False):
        """The result stored as the mode stores it."""
        if decision is None:
            return output
        if decision.out_dtype is not None:
            dtype = decision.out_dtype
            output = _map_floats(output, lambda t: t.to(dtype))
        target = decision.inplace_target
        if target is not None and not replay and isinstance(output, torch.Tensor) and output is not target:
            with torch.no_grad():
                target.copy_(output)
            return target
        return output


@contextlib.contextmanager
def _autocast_off(device_type: str):
    """``torch.autocast(device_type, enabled=False)`` inside an enabled autocast region, at a fraction
    of its cost (it runs once per node): only the enabled flag changes, the cache and the nesting
    belong to the enclosing region."""
    try:
        enabled = torch.is_autocast_enabled(device_type)
    except TypeError:  # torch versions without the per-device functions
        with torch.autocast(device_type, enabled=False):
            yield
        return
    torch.set_autocast_enabled(device_type, False)
    try:
        yield
    finally:
        torch.set_autocast_enabled(device_type, enabled)


def _rounded_up(t: torch.Tensor, low: torch.dtype) -> torch.Tensor:
    """A float32, float16 or bfloat16 operand as float32 holding values of ``low``: an operand in
    ``low`` already only widens (its rounding again would be two conversions that change nothing)."""
    if t.dtype == low:
        return t.float()
    return round_to(t.float(), low) if _is_float32ish(t) else t


def _all_floats_in(args, kwargs, dtype: torch.dtype) -> bool:
    floats = [v for v in flatten(args, kwargs)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()]
    return bool(floats) and all(v.dtype == dtype for v in floats)


def _is_float32ish(t: torch.Tensor) -> bool:
    return t.dtype in (torch.float32,) + REDUCED_FLOATS


def _first_tensor(args) -> Optional[torch.Tensor]:
    return args[0] if args and isinstance(args[0], torch.Tensor) else None


def _map_floats(value, fn):
    return map_tensors(lambda t: fn(t) if t.is_floating_point() else t, value)


def _map_operands(node, callee, args, kwargs, fn):
    """Apply ``fn`` to the multiplied operands of a dot product (not to its bias)."""
    if isinstance(callee, torch.nn.Module):
        return _map_floats(args, fn), kwargs
    positions = _OPERANDS.get(node.fn)
    if positions is None:
        return _map_floats(args, fn), _map_floats(kwargs, fn)
    new_args = tuple(fn(a) if i in positions and isinstance(a, torch.Tensor) and a.is_floating_point() else a
                     for i, a in enumerate(args))
    new_kwargs = {k: (fn(v) if k in ("input", "weight", "mat1", "mat2", "batch1", "batch2") and
                      isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in kwargs.items()}
    return new_args, new_kwargs


def _any_reduced(args, kwargs) -> bool:
    return any(isinstance(v, torch.Tensor) and v.dtype in REDUCED_FLOATS for v in flatten(args, kwargs)[0])


def _stored_dtype(node, callee, args, kwargs) -> Optional[torch.dtype]:
    """The dtype an op autocast does not list stores its result in: type promotion over its float
    operands, except for batch norms (numerics.PROMOTING_BATCHNORMS says why): ``F.batch_norm``
    keeps its input's dtype whatever its weights' and statistics', a FrozenBatchNorm2d promotes its
    input with its buffers."""
    if node.kind == Kind.BATCHNORM:
        x = _first_tensor(args)
        x = x if x is not None else kwargs.get("input")
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            if isinstance(callee, torch.nn.Module) and node.module_type in PROMOTING_BATCHNORMS:
                buffers = [b.dtype for b in callee.buffers() if b.is_floating_point()]
                return torch.promote_types(x.dtype, buffers[0]) if buffers else x.dtype
            return x.dtype
    return _promoted(args, kwargs)


def _promoted(args, kwargs) -> Optional[torch.dtype]:
    """The float dtype torch's type promotion gives these operands (dimensioned tensors win over
    zero-dimensional ones)."""
    floats = [v for v in flatten(args, kwargs)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not floats:
        return None
    ranked = [t for t in floats if t.dim() > 0] or floats
    dtype = ranked[0].dtype
    for t in ranked[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def tf32_kernel(node, callee, args, kwargs) -> bool:
    """Whether the emulation rounds a conv's or matmul's operands to TF32: where core/kernels.py says
    the backend may take a TF32 kernel (the assumption the headline prediction makes too), not where
    it was measured not to (depthwise convs, convs over 4 or fewer channels per group, single-row
    products; probe_h200_agree.json in benchmarks/CLAIMS.md). The shapes are the check's where it
    recorded the node (the output's positions), else the call's."""
    x = args[0] if args and isinstance(args[0], torch.Tensor) else kwargs.get("input")
    out = node.out.shape if getattr(node, "out", None) is not None else None
    if node.kind == Kind.CONV:
        weight = getattr(callee, "weight", None) if isinstance(callee, torch.nn.Module) else (
            args[1] if len(args) > 1 else kwargs.get("weight"))
        if not isinstance(weight, torch.Tensor):
            return True
        transposed = bool(getattr(callee, "transposed", False)) or "transpose" in node.fn
        groups = getattr(callee, "groups", None) or node.groups or 1
        if out is None and isinstance(x, torch.Tensor) and x.dim() >= 3 and weight.dim() >= 3 \
                and all(k == 1 for k in weight.shape[2:]):
            out = (x.shape[0], 0) + tuple(x.shape[2:])  # a 1x1 conv: one output per input pixel (at stride 1)
        return conv_uses_tf32(tuple(weight.shape), groups, transposed, _rows(out, channels_first=True))
    if node.kind == Kind.MATMUL and len(args) >= 2 and all(isinstance(a, torch.Tensor) for a in args[:2]):
        a, b = args[0], args[1]
        if node.fn == "scaled_dot_product_attention" and a.dim() >= 2 and b.dim() >= 2:
            return product_kernel(a.shape[-2], b.shape[-2], a.shape[-1]) != FLOAT32  # queries x keys
        return product_kernel(a.shape[-2] if a.dim() >= 2 else 1, b.shape[-1] if b.dim() >= 2 else 1,
                              a.shape[-1]) != FLOAT32
    if out is None and isinstance(x, torch.Tensor) and x.dim() >= 1:
        out = tuple(x.shape[:-1]) + (None,)
    weight = getattr(callee, "weight", None) if isinstance(callee, torch.nn.Module) else (
        args[1] if len(args) > 1 and isinstance(args[1], torch.Tensor) else kwargs.get("weight"))
    return product_uses_tf32(_rows(out), tuple(weight.shape) if isinstance(weight, torch.Tensor) else None)


def _rows(shape, channels_first: bool = False) -> Optional[int]:
    """The rows of a product's result: all but the last dimension, or for a conv (channels first)
    all but the channels."""
    if not shape or len(shape) < (3 if channels_first else 1):
        return None
    rest = [d for i, d in enumerate(shape) if i != (1 if channels_first else len(shape) - 1)]
    rows = 1
    for d in rest:
        rows *= d
    return rows


def conv_uses_tf32(weight_shape: tuple, groups: int, transposed: bool, rows: Optional[int]) -> bool:
    """``rows``: the output positions (batch x pixels), None where unknown."""
    if len(weight_shape) < 3:
        return True
    per_group = weight_shape[0] if transposed else weight_shape[1]
    out_per_group = weight_shape[1] if transposed else weight_shape[0] // max(groups, 1)
    kernel = 1
    for k in weight_shape[2:]:
        kernel *= k
    return conv_kernel(per_group, groups, kernel, rows, out_per_group) != FLOAT32


def product_uses_tf32(rows: Optional[int], weight_shape: Optional[tuple]) -> bool:
    """A linear layer (weight out x in) over ``rows`` rows; a single row is a matrix-vector product."""
    cols, reduction = (weight_shape[0], weight_shape[-1]) if weight_shape and len(weight_shape) == 2 else (None, None)
    return product_kernel(rows, cols, reduction) != FLOAT32


def _module_uses_tf32(node, module) -> bool:
    """The kernel rule for a module node, from the output shape the check recorded."""
    out = node.out.shape if node.out is not None else None
    weight = getattr(module, "weight", None)
    shape = tuple(weight.shape) if isinstance(weight, torch.Tensor) else None
    if node.kind == Kind.CONV and shape is not None:
        return conv_uses_tf32(shape, getattr(module, "groups", 1) or 1, bool(getattr(module, "transposed", False)),
                              _rows(out, channels_first=True))
    return product_uses_tf32(_rows(out), shape)


def _weight_uses_tf32(module) -> bool:
    """The kernel rule for a module no node of the check calls as a module (its parameters are read by
    functional ops, or the whole model is one layer): from its weight's shape alone."""
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        return True
    if ops.classify_module(module)[0] == Kind.CONV:
        return conv_uses_tf32(tuple(weight.shape), getattr(module, "groups", 1) or 1,
                              bool(getattr(module, "transposed", False)), None)
    return True


# --------------------------------------------------------------------------------------- building


def describe_mode(name: str, device: torch.device, emulated: bool) -> str:
    mode = MODES[name]
    if mode.recipe is not None:
        return describe_scaled(name, mode.recipe, gemm_backend(mode.recipe, device, emulated))
    if mode.floor:
        kernels = "cuDNN and cuBLAS in IEEE float32" if device.type == "cuda" else f"{device.type}'s float32 kernels"
        return f"float32 as it runs on {device.type}, TF32 off ({kernels}), against float64"
    if emulated:
        if mode.rounds_products_only:
            return ("emulated: conv, linear and matmul operands rounded to TF32 (10 mantissa bits, nearest even), "
                    "float32 accumulation, wherever the prediction assumes a TF32 kernel: every one the backend may "
                    "choose, not depthwise convs, convs over <= 4 channels per group or single-row products, which an "
                    "H200 ran in float32")
        low = mode.low.name
        if mode.autocast:
            return (f"emulated autocast({low}) with CUDA's op lists: listed ops round operands and parameters to {low}, "
                    f"accumulate in float32 and store {low}; other ops compute in float32 and store the promoted dtype")
        return f"emulated: parameters, buffers and inputs rounded to {low}; every op computes in float32 and stores {low}"
    if mode.rounds_products_only:
        return "TF32 on for cuDNN convolutions and cuBLAS matmuls"
    dtype = str(LOW_DTYPES[mode.low.name])
    if mode.autocast:
        return f"torch.autocast('{device.type}', dtype={dtype}), TF32 off"
    return f"model and float inputs cast with .to({dtype}), TF32 off"


@dataclass
class SharedCopies:
    """What the modes' copies of one model share: the maps between copies, built once for all modes,
    and the WeightStream ``model32`` streams through (None when it is whole on the device)."""

    maps: Dict[Any, Dict[int, Any]] = field(default_factory=dict)
    stream: Any = None


def build_mode_run(runner, model32: torch.nn.Module, inputs32: tuple, graph=None,
                   shared: Optional[SharedCopies] = None, only: Optional[str] = None) -> ModeRun:
    """The copy of the model and the inputs ``runner`` (a runners.Runner: its mode, device and way)
    runs; model32 lives on its device. ``only``: the path of the one module the mode applies to
    (autocast modes and tf32), the rest running in float32.

    A copy shares every parameter it does not change with ``model32``: only the rounded or cast
    ones are new tensors, so a mode costs the memory of what it changes. ``shared.maps``: where the
    maps between copies are kept for the next mode (the native modes all run ``model32`` itself).
    ``shared.stream``: the WeightStream ``model32`` streams through; the copy streams beside it.
    """
    name, device, emulated = runner.name, runner.device, runner.emulated
    shared = SharedCopies() if shared is None else shared
    stream, maps = shared.stream, shared.maps
    mode = MODES[name]
    if only is not None and mode.low is not None and not mode.autocast:
        raise ValueError(f"{name} casts the whole model: it cannot run one module alone")
    low = LOW_DTYPES.get(mode.low.name) if mode.low is not None else None
    inputs = inputs32
    low_params: frozenset = frozenset()
    inside = None if only is None else {id(m) for m in model32.get_submodule(only).modules()}

    def limited(change):
        """``change`` for the tensors of the modules the mode applies to."""
        if inside is None:
            return change
        return lambda module, pname, t: change(module, pname, t) if id(module) in inside else None

    elsewhere: set = set()
    scaled = set() if mode.recipe is None else {id(m) for m in model32.modules() if converts(m, mode.recipe)}
    with torch.no_grad():
        if not emulated and mode.recipe is not None:
            variant = _variant(stream, model32, lambda module, pname, t: None)
        elif not emulated:
            if mode.low is None or mode.autocast:
                variant = model32
            else:
                variant = _variant(stream, model32, lambda module, pname, t: t.to(low) if t.is_floating_point() else None)
                inputs = _cast_inputs(inputs32, low)
        elif mode.rounds_products_only:
            uses = _tf32_modules(model32, graph)

            def to_tf32(module, pname, t):
                if id(module) in uses and "weight" in pname and t.dtype == torch.float32:
                    return round_tf32(t)
                return None

            variant = _variant(stream, model32, limited(to_tf32))
        elif mode.autocast:
            # modules the model's code calls with autocast off (or lowering to another dtype) keep
            # their float32 weights
            elsewhere = {n.module_path for n in (graph.nodes if graph is not None else ())
                         if n.target.startswith("nn.") and autocast_format(n.autocast, mode) != mode.low}
            lower = {id(m): LOW_DTYPES[autocast_lowered(ops.classify_module(m)[1], mode.low).name]
                     for path, m in model32.named_modules()
                     if ops.is_leaf_module(m) and autocast_policy(ops.classify_module(m)[1]) == "lower"
                     and path not in elsewhere and id(m) not in scaled}
            variant = _variant(stream, model32, limited(lambda module, pname, t: round_to(t, lower[id(module)])
                                                        if id(module) in lower and t.dtype == torch.float32 else None))
        else:
            variant = _variant(stream, model32, lambda module, pname, t: round_to(t, low) if t.dtype == torch.float32 else None)
            low_params = frozenset(id(t) for t in list(variant.parameters()) + list(variant.buffers()) if t.is_floating_point())
            inputs = _cast_inputs(inputs32, low)
    if emulated and low is not None:
        elsewhere = elsewhere if mode.autocast else set()
        # (under autocast cuDNN's RNNs store their states in float16 whatever its dtype)
        stored = LOW_DTYPES[CUDNN_RNN_AUTOCAST] if mode.autocast else low
        _step_recurrences(model32, variant, stored, lambda path, m: path not in elsewhere and (inside is None or id(m) in inside))
    if mode.recipe is not None:  # the layers the recipe converts run as its scaled GEMMs
        backend = gemm_backend(mode.recipe, device, emulated)
        within = None if inside is None else {id(m) for path, m in variant.named_modules()
                                              if id(model32.get_submodule(path)) in inside}
        convert_linears(variant, mode.recipe, backend, native=not emulated, inside=within)
    if stream is not None:
        stream.register(variant, base=model32)
    run = ModeRun(name, mode, device, emulated, variant, inputs, runner.how, low_params=low_params,
                  sets_tf32=runner.sets_tf32, only=only)
    def kept(key, build):
        if variant is not model32:  # a copy of this mode only: keeping its maps would keep the copy
            return build()
        if key not in maps:
            maps[key] = build()
        return maps[key]

    # keyed by the copies themselves (held in the key, so an id is never reused while kept)
    run.originals = kept(("modules", variant, model32), lambda: _module_map(variant, model32))
    run.original_tensors = kept(("tensors", variant, model32), lambda: _tensor_map(variant, model32))
    run.reference_tensors = run.original_tensors
    return run


def _step_recurrences(model32: torch.nn.Module, variant: torch.nn.Module, low: torch.dtype, applies) -> None:
    """The emulated mode's LSTM, GRU and RNN modules (``applies(path, float32 module)``) compute step by step
    and store their states in ``low`` after each step, as the reduced-precision kernels do
    (measure/recurrent.py); a module the copy shares with the float32 model is left as it is."""
    originals = dict(model32.named_modules())
    for path, module in variant.named_modules():
        original = originals.get(path)
        if type(module) not in RECURRENT_TYPES or original is None or original is module or not applies(path, original):
            continue

        def forward(input, hx=None, _module=module):
            if not steppable(_module, (input,)):
                return type(_module).forward(_module, input, hx)
            return run_steps(_module, input, hx, store=stored_in(low))

        module.forward = forward


def _variant(stream, model: torch.nn.Module, change) -> torch.nn.Module:
    """A copy of ``model`` whose tensors are ``change(module, name, tensor)``, or shared where that is
    None (made as each block is filled, when ``stream`` streams the model)."""
    memo = detached_state(model)
    for module in model.modules():
        for pname, t in list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False)):
            if id(t) in memo:
                continue
            if stream is None:
                new = change(module, pname, t.detach())
                if new is not None and new.dtype == t.dtype and new.shape == t.shape and torch.equal(new, t):
                    # exact in the format already (a model trained or stored in it): the copy shares
                    # it, and its calls are then seen to compute as the float32 model's do
                    new = None
            else:
                new = stream.derived(t.detach(), lambda value, m=module, n=pname: change(m, n, value))
            if new is None:
                memo[id(t)] = t
            elif isinstance(t, torch.nn.Parameter):
                memo[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad)
            else:
                memo[id(t)] = new
    return clone_module(model, memo)


def _tf32_modules(model: torch.nn.Module, graph) -> set:
    """ids of the dot-product modules whose kernels take TF32 (tf32_kernel), judged from the shapes
    the check recorded for the nodes that call them."""
    uses = {}
    modules = dict(model.named_modules(remove_duplicate=False))  # a shared module under each of its names
    for node in (graph.nodes if graph is not None else ()):
        module = modules.get(node.module_path) if node.target.startswith("nn.") else None
        if module is not None and node.kind in DOT_PRODUCT_KINDS:
            uses.setdefault(id(module), _module_uses_tf32(node, module))
    return {id(m) for _, m in _dot_modules(model) if uses.get(id(m), _weight_uses_tf32(m))}


def _cast_inputs(inputs, dtype: torch.dtype) -> Inputs:
    return Inputs.of(inputs).map(lambda v: v.to(dtype) if v.is_floating_point() else v)


def _dot_modules(model: torch.nn.Module):
    for path, module in model.named_modules():
        if ops.is_leaf_module(module) and ops.classify_module(module)[0] in DOT_PRODUCT_KINDS:
            yield path, module


def _module_map(variant: torch.nn.Module, other: torch.nn.Module) -> Dict[int, torch.nn.Module]:
    others = dict(other.named_modules())
    return {id(m): others[path] for path, m in variant.named_modules() if path in others}


def _tensor_map(variant: torch.nn.Module, other: torch.nn.Module) -> Dict[int, torch.Tensor]:
    others = dict(other.named_parameters(remove_duplicate=False))
    others.update(dict(other.named_buffers(remove_duplicate=False)))
    mapped = {}
    for path, t in list(variant.named_parameters(remove_duplicate=False)) + list(variant.named_buffers(remove_duplicate=False)):
        if path in others:
            mapped[id(t)] = others[path]
    return mapped
