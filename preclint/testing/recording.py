"""What a test ran while ``pytest --preclint`` watches it: each call of a top-level module (the
module, its inputs, its output and the precision settings it ran under) and the last
``torch.allclose`` that answered False, so that a failed comparison can be traced back to the model
that computed the compared tensor and the precision it computed it in.

Only while a test's body runs, and only with ``--preclint``: a global forward pre-hook and hook on
every module (the calls nested in another module's forward are not recorded) and ``torch.allclose``
and ``Tensor.allclose`` replaced by wrappers that return what they return. Compiled regions are
not watched (the hooks return at once under ``torch.compile``'s tracing).
"""
from __future__ import annotations

import collections
import functools
import sys
from dataclasses import dataclass, field
from types import FrameType
from typing import Any, Deque, Dict, List, Optional

import torch
import torch.nn.modules.module as module_hooks

from preclint.load.modelio import Inputs

AUTOCAST_DEVICES = ("cpu", "cuda")
MOST_CALLS = 16  # the top-level calls kept per test, the latest ones: a test compares what it just computed


@dataclass(frozen=True)
class Settings:
    """The settings that decide the precision a float32 model computes in, as they stood for one call.

    ``device``: the device type the model ran on; ``autocast``: device type -> the dtype autocast casts
    to, for each device where it was on; ``matmul_tf32``/``conv_tf32``: TF32 allowed for CUDA matmuls /
    cuDNN convolutions (the flags; the CPU has no TF32); ``dtype``: the model's parameters' dtype;
    ``tf32_capable``: the device computes in TF32 where allowed (CUDA, compute capability 8.0 or more)."""

    device: str = "cpu"
    autocast: Dict[str, str] = field(default_factory=dict)
    matmul_tf32: bool = False
    conv_tf32: bool = False
    dtype: str = "float32"
    tf32_capable: bool = True
    training: bool = False  # the module (or one of its submodules) was in train mode


def _flag(legacy, current) -> bool:
    """A TF32 flag: the legacy attribute, or the fp32_precision API where reading the legacy one
    raises (torch >= 2.9 refuses to mix them)."""
    try:
        return bool(legacy())
    except Exception:
        try:
            return bool(current())
        except Exception:
            return False


def tf32_flags() -> Dict[str, bool]:
    b = torch.backends
    matmul = _flag(lambda: b.cuda.matmul.allow_tf32, lambda: b.cuda.matmul.fp32_precision == "tf32")
    try:
        matmul = matmul or torch.get_float32_matmul_precision() != "highest"
    except Exception:
        pass
    conv = _flag(lambda: b.cudnn.allow_tf32, lambda: b.cudnn.conv.fp32_precision == "tf32")
    return {"matmul_tf32": matmul, "conv_tf32": conv}


def autocast_state() -> Dict[str, str]:
    found = {}
    for device in AUTOCAST_DEVICES:
        try:
            if torch.is_autocast_enabled(device):
                found[device] = str(torch.get_autocast_dtype(device)).replace("torch.", "")
        except Exception:  # a device type this build does not know
            continue
    return found


def _first_tensor(value: Any) -> Optional[torch.Tensor]:
    for leaf in torch.utils._pytree.tree_leaves(value):
        if isinstance(leaf, torch.Tensor):
            return leaf
    return None


def settings_now(module: Optional[torch.nn.Module] = None, inputs: Any = None) -> Settings:
    """The settings as they stand, for ``module`` called on ``inputs``: its device and dtype are its
    first floating parameter's (else the first input tensor's)."""
    param = None
    if module is not None:
        param = next((p for p in module.parameters() if p.is_floating_point()), None)
    where = param if param is not None else _first_tensor(inputs)
    device = where.device.type if where is not None else "cpu"
    dtype = str(param.dtype).replace("torch.", "") if param is not None else "float32"
    capable = device == "cuda" and _tf32_capable(where.device)
    training = module is not None and any(m.training for m in module.modules())
    return Settings(device, autocast_state(), dtype=dtype, tf32_capable=capable, training=training, **tf32_flags())


def _tf32_capable(device: torch.device) -> bool:
    try:
        return torch.cuda.get_device_capability(device)[0] >= 8  # Ampere and newer
    except Exception:
        return True  # unknown: the flags decide


@dataclass(frozen=True)
class RecordedCall:
    """One call of a top-level module in a test."""

    module: torch.nn.Module
    inputs: Inputs
    output: Any
    settings: Settings
    precision: Optional[str] = None  # where preclint computed the output under a precision it names


@dataclass(frozen=True)
class Rejection:
    """A ``torch.allclose`` that answered False: where it was called, and what it compared."""

    frame: FrameType
    line: int
    actual: Any
    expected: Any
    rtol: float
    atol: float


def _compiling() -> bool:
    compiler = getattr(torch, "compiler", None)
    return bool(compiler is not None and compiler.is_compiling())


def _by_preclint(frame: Optional[FrameType], most: int = 64) -> bool:
    """Whether ``frame`` or one of its callers is preclint's own code: its runs of a model (a copy,
    a graph's submodules one by one) are not the test's calls."""
    while frame is not None and most > 0:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("preclint.") and name != __name__:
            return True
        frame, most = frame.f_back, most - 1
    return False


class Recorder:
    """Records a test's top-level module calls and its last rejecting allclose, for the body of a
    ``with``; everything it installed is removed at the end. ``Recorder.active``: the one recording
    now, which preclint.testing.output_under tells what it computed (``note``)."""

    active: Optional["Recorder"] = None

    def __init__(self, most: int = MOST_CALLS) -> None:
        self.calls: Deque[RecordedCall] = collections.deque(maxlen=most)
        self.rejection: Optional[Rejection] = None
        self._depth = 0
        self._pending: List[Settings] = []
        self._undo: List[Any] = []

    def __enter__(self) -> "Recorder":
        self._undo.append(module_hooks.register_module_forward_pre_hook(self._before).remove)
        self._undo.append(module_hooks.register_module_forward_hook(self._after, with_kwargs=True, always_call=True).remove)
        self._wrap_allclose()
        Recorder.active = self
        return self

    def __exit__(self, *exc_info) -> None:
        Recorder.active = None
        while self._undo:
            self._undo.pop()()
        self._depth, self._pending = 0, []

    def forget(self) -> None:
        """Drop what was recorded (the tensors and frames it holds)."""
        self.calls.clear()
        self.rejection = None

    def _before(self, module, args) -> None:
        if _compiling():
            return
        if self._depth == 0:
            self._pending.append(None if _by_preclint(sys._getframe(1)) else settings_now(module, args))
        self._depth += 1

    def _after(self, module, args, kwargs, output) -> None:
        if _compiling() or self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._pending:
            settings = self._pending.pop()
            if settings is not None:
                module = getattr(module, "_orig_mod", module)  # torch.compile's wrapper: the model it compiled
                self.calls.append(RecordedCall(module, Inputs(tuple(args), dict(kwargs or {})), output, settings))

    def note(self, model: torch.nn.Module, inputs: Inputs, output: Any, precision: str) -> None:
        """``output`` is ``model``'s on ``inputs`` computed by preclint under ``precision``."""
        self.calls.append(RecordedCall(model, inputs, output, settings_now(model, inputs.args), precision))

    def _wrap_allclose(self) -> None:
        original = torch.allclose
        recorder = self

        @functools.wraps(original)
        def allclose(input, other, rtol=1e-05, atol=1e-08, equal_nan=False):
            result = original(input, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
            if not result:
                recorder._reject(sys._getframe(1), input, other, rtol, atol)
            return result

        def tensor_allclose(self, other, rtol=1e-05, atol=1e-08, equal_nan=False):
            result = original(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan)
            if not result:
                recorder._reject(sys._getframe(1), self, other, rtol, atol)
            return result

        own = "allclose" in torch.Tensor.__dict__
        method = torch.Tensor.__dict__.get("allclose")
        torch.allclose = allclose
        torch.Tensor.allclose = tensor_allclose

        def restore() -> None:
            torch.allclose = original
            if own:
                torch.Tensor.allclose = method
            else:
                del torch.Tensor.allclose

        self._undo.append(restore)

    def _reject(self, frame: FrameType, actual, expected, rtol: float, atol: float) -> None:
        self.rejection = Rejection(frame, frame.f_lineno, actual, expected, float(rtol), float(atol))
