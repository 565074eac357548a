"""The autocast regions a model's own code sets, as capture sees them.

A model decides part of its precision itself: ``with torch.autocast(device, enabled=False):`` around
a rotary angle table or an attention softmax, ``torch.autocast(device, dtype=torch.bfloat16)``
around a block, ``@torch.amp.custom_fwd(cast_inputs=torch.float32)`` on a custom autograd
function. torch.fx's symbolic tracing runs these context managers while it traces but records
nothing of them (only torch.export's pre-dispatch tracing records ``_enter_autocast`` nodes), and
the fp32 reference run has autocast off, so neither path sees them by itself. While a capture runs,
:func:`recording` wraps the few entry points that set a region, so each op can be labelled with the
region around it (:func:`current`):

* ``torch.autocast.__init__/__enter__/__exit__`` (``torch.cuda.amp.autocast`` and
  ``torch.cpu.amp.autocast`` are subclasses and call them): the region as the code asked for it,
  before the constructor turns a CUDA region off on a machine without CUDA;
* ``torch.autograd.Function.apply``: a forward decorated with ``custom_fwd(cast_inputs=...)`` runs
  with autocast off and its float inputs cast, wherever autocast is on around it;
* ``torch.is_autocast_enabled``: helpers that enter a region only when autocast is on (transformers'
  ``maybe_autocast(device, enabled=False)``) are told it is, as it is under the precision a user
  targets, so that their region is entered and recorded. Only callers that build an autocast region
  themselves are told so; every other caller (code that casts to ``torch.get_autocast_dtype()``
  when autocast is on) gets the truth, so the fp32 reference stays fp32.
"""
from __future__ import annotations

import contextlib
import inspect
import itertools
import os
import sys
from typing import Iterator, List, Optional

import torch
from torch.utils._pytree import tree_map

from preclint.core.ir import AutocastRegion

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


class _Recording:
    def __init__(self) -> None:
        self.stack: List[AutocastRegion] = []
        self.depth = 0
        self.serials = itertools.count(1)
        self.saved: dict = {}


_STATE = _Recording()


def current() -> Optional[AutocastRegion]:
    """The innermost region the model's code has entered and not left (None outside any)."""
    return _STATE.stack[-1] if _STATE.stack else None


def _dtype_name(dtype) -> Optional[str]:
    return str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else None


def _push(enabled: bool, dtype: Optional[str] = None, cast_inputs: Optional[str] = None) -> None:
    _STATE.stack.append(AutocastRegion(enabled, dtype, cast_inputs, current(), next(_STATE.serials)))


def _pop() -> None:
    if _STATE.stack:
        _STATE.stack.pop()


def custom_fwd_cast(forward) -> Optional[torch.dtype]:
    """The ``cast_inputs`` dtype of a forward decorated with ``torch.amp.custom_fwd`` (None when it
    has none: such a forward runs under its caller's autocast state, as any other code)."""
    code = getattr(forward, "__code__", None)
    if code is None or code.co_name != "decorate_fwd" or "cast_inputs" not in code.co_freevars:
        return None
    try:
        value = forward.__closure__[code.co_freevars.index("cast_inputs")].cell_contents
    except (TypeError, IndexError, ValueError):  # an empty cell
        return None
    return value if isinstance(value, torch.dtype) else None


def _install() -> None:
    autocast = torch.amp.autocast_mode.autocast
    function = torch.autograd.function.Function
    saved = _STATE.saved = {
        "init": autocast.__init__, "enter": autocast.__enter__, "exit": autocast.__exit__,
        "apply": function.__dict__["apply"], "enabled": torch.is_autocast_enabled,
    }
    signature = inspect.signature(saved["init"])

    def init(self, *args, **kwargs):
        saved["init"](self, *args, **kwargs)
        try:
            asked = signature.bind(self, *args, **kwargs)
        except TypeError:
            return
        asked.apply_defaults()
        self._preclint_asked = (bool(asked.arguments.get("enabled", True)), _dtype_name(asked.arguments.get("dtype")))

    def enter(self):
        result = saved["enter"](self)
        # an instance made before the capture (a decorator applied at import) has no record of what
        # it asked for: its effective state stands in
        enabled, dtype = getattr(self, "_preclint_asked", (getattr(self, "_enabled", True), None))
        _push(enabled, dtype if enabled else None)
        return result

    def exit(self, *exc):
        try:
            return saved["exit"](self, *exc)
        finally:
            _pop()

    def apply(cls, *args, **kwargs):
        cast = custom_fwd_cast(getattr(cls, "forward", None))
        if cast is None:
            return saved["apply"].__get__(None, cls)(*args, **kwargs)
        _push(False, None, _dtype_name(cast))
        try:
            return saved["apply"].__get__(None, cls)(*args, **kwargs)
        finally:
            _pop()

    def is_autocast_enabled(*args, **kwargs):
        truth = saved["enabled"](*args, **kwargs)
        if truth:
            return truth
        caller = sys._getframe(1).f_code
        return "autocast" in caller.co_names and not os.path.abspath(caller.co_filename).startswith(_TORCH_DIR)

    autocast.__init__, autocast.__enter__, autocast.__exit__ = init, enter, exit
    function.apply = classmethod(apply)
    torch.is_autocast_enabled = is_autocast_enabled


def _uninstall() -> None:
    saved = _STATE.saved
    autocast = torch.amp.autocast_mode.autocast
    autocast.__init__, autocast.__enter__, autocast.__exit__ = saved["init"], saved["enter"], saved["exit"]
    torch.autograd.function.Function.apply = saved["apply"]
    torch.is_autocast_enabled = saved["enabled"]
    _STATE.saved = {}
    _STATE.stack.clear()


@contextlib.contextmanager
def recording() -> Iterator[None]:
    """Record the regions the model's code enters while the block runs (re-entrant)."""
    if _STATE.depth == 0:
        _install()
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1
        if _STATE.depth == 0:
            _uninstall()


def _device_of(values) -> str:
    for v in values:
        if isinstance(v, torch.Tensor):
            return v.device.type
    return "cpu"


@contextlib.contextmanager
def replaying(region: Optional[AutocastRegion], args, kwargs):
    """Run one op of a replayed FX graph in the region its code set, where autocast is on (a native
    autocast run of the probe). A run without autocast (the fp32 reference) stays as it is: an
    enabled region there would put reduced precision into the reference. Yields the arguments the
    op reads (cast, in a ``custom_fwd(cast_inputs=...)`` forward)."""
    device = _device_of(list(args) + list(kwargs.values())) if region is not None else "cpu"
    if region is None or not torch.is_autocast_enabled(device):
        yield args, kwargs
        return
    cast = next((r.cast_inputs for r in _chain(region) if r.cast_inputs), None)
    if cast is not None:
        dtype = getattr(torch, cast)

        def to(value):  # as custom_fwd casts: float tensors other than float64
            eligible = isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64
            return value.to(dtype) if eligible else value

        args, kwargs = tree_map(to, (tuple(args), dict(kwargs)))
    enabled = region.enabled and region.cast_inputs is None
    dtype = getattr(torch, region.dtype) if enabled and region.dtype else torch.get_autocast_dtype(device)
    with torch.autocast(device, dtype=dtype, enabled=enabled):
        yield args, kwargs


def _chain(region: Optional[AutocastRegion]) -> Iterator[AutocastRegion]:
    while region is not None:
        yield region
        region = region.outer
