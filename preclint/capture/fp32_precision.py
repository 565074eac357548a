"""The float32 precision settings (TF32 and bf16 for float32 work), saved and given back so that
every getter reads afterwards what it read before, the raising ones included.

torch keeps two sets of state behind these getters: the legacy ones (``float32_matmul_precision``,
behind ``torch.get_float32_matmul_precision()`` and ``torch.backends.cuda.matmul.allow_tf32``; and
cuDNN's ``allow_tf32`` flag) and, from torch 2.9, an ``fp32_precision`` per backend and op
(``torch.backends[.cuda.matmul|.cudnn.conv|...].fp32_precision``). The setters of each write some of
the other, and the legacy getters raise ("a mix of the legacy and new APIs") where the two disagree.
Writing back only the new settings (or only the legacy ones) can leave them disagreeing, and then
reading ``torch.backends.cuda.matmul.allow_tf32`` raises in the caller's process although it did not
before. So both are saved, each through the getter it is read with; the legacy state is written
first (through its own setters), then each ``fp32_precision`` that now reads otherwise, parents
before their children, and the whole is read again and must match. Where a legacy getter raised
before (the caller had mixed the APIs), its value cannot be read: each value it can take is tried
until every getter reads (and raises) as before.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Tuple

import torch

RAISES = "<raises>"  # the reading of a getter that raised: restored as raising too

# (backend, op) of each fp32_precision, parents before their children
_NEW_API = (("generic", "all"), ("cuda", "all"), ("cuda", "matmul"), ("cuda", "conv"), ("cuda", "rnn"),
            ("mkldnn", "all"), ("mkldnn", "matmul"), ("mkldnn", "conv"), ("mkldnn", "rnn"))
_LEGACY_MATMUL = "torch.get_float32_matmul_precision()"
_LEGACY_CUDNN = "torch.backends.cudnn.allow_tf32"
_MATMUL_VALUES = ("highest", "high", "medium")


def _getter(read: Callable[[], Any]) -> Callable[[], Any]:
    def value():
        try:
            return read()
        except (RuntimeError, ValueError, TypeError):  # torch's "mix of the legacy and new APIs"
            return RAISES

    return value


def _new_api() -> List[Tuple[str, str]]:
    """The (backend, op) pairs this torch has an fp32_precision for (none before torch 2.9)."""
    get = getattr(torch._C, "_get_fp32_precision_getter", None)
    if get is None or getattr(torch._C, "_set_fp32_precision_setter", None) is None:
        return []
    found = []
    for pair in _NEW_API:
        try:
            get(*pair)
        except (RuntimeError, ValueError, TypeError):  # a pair this build does not know
            continue
        found.append(pair)
    return found


def _getters() -> Dict[str, Callable[[], Any]]:
    getters: Dict[str, Callable[[], Any]] = {
        _LEGACY_MATMUL: _getter(torch.get_float32_matmul_precision),
        "torch.backends.cuda.matmul.allow_tf32": _getter(lambda: torch.backends.cuda.matmul.allow_tf32),
        _LEGACY_CUDNN: _getter(lambda: torch.backends.cudnn.allow_tf32),
    }
    for backend, op in _new_api():
        getters[f"fp32_precision({backend}, {op})"] = _getter(
            lambda b=backend, o=op: torch._C._get_fp32_precision_getter(b, o))
    return getters


def read() -> Dict[str, Any]:
    """What each float32-precision getter reads now (RAISES where it raises)."""
    return {name: get() for name, get in _getters().items()}


def write(saved: Dict[str, Any]) -> None:
    """Make every getter read as in ``saved`` (from ``read``); RuntimeError where no setting of the
    legacy state does (a getter this torch lacks, or state no setter reaches)."""
    if read() == saved:
        return  # the common case: nothing touched, nothing written (the hidden state stays exact)
    matmul = [saved[_LEGACY_MATMUL]] if saved.get(_LEGACY_MATMUL) in _MATMUL_VALUES else list(_MATMUL_VALUES)
    cudnn = [saved[_LEGACY_CUDNN]] if isinstance(saved.get(_LEGACY_CUDNN), bool) else [False, True]
    for precision in matmul:
        for allow in cudnn:
            torch.set_float32_matmul_precision(precision)
            torch.backends.cudnn.allow_tf32 = allow
            _write_new_api(saved)
            if read() == saved:
                return
    now = read()
    raise RuntimeError("the float32 precision settings could not be given back: "
                       + ", ".join(f"{name} reads {now.get(name)!r}, not {value!r}"
                                   for name, value in saved.items() if now.get(name) != value))


def _write_new_api(saved: Dict[str, Any]) -> None:
    """Each fp32_precision that reads otherwise than in ``saved`` set to it, parents first (setting a
    parent may change what its children read, so each is read after those before it are set)."""
    for backend, op in _new_api():
        value = saved.get(f"fp32_precision({backend}, {op})")
        if value is None or value == RAISES:
            continue
        if _getter(lambda: torch._C._get_fp32_precision_getter(backend, op))() != value:
            torch._C._set_fp32_precision_setter(backend, op, value)
