"""The interpreter's own state a model's code may change (no torch here): the working directory,
``sys.path``, the environment variables and the recursion limit, each as a (name, read, write)
setting of preclint.capture.global_state.

Each read is a shallow copy (a string, a list of strings, a dict of strings), so saving costs
microseconds; each write changes only what differs, in place (``sys.path`` stays the same list
object, ``os.environ`` the same mapping, and the C environment follows it through putenv/unsetenv).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict, List, Tuple

Setting = Tuple[str, Callable[[], Any], Callable[[Any], None]]


def _write_path(saved: List[str]) -> None:
    if sys.path != saved:
        sys.path[:] = saved


def _write_environ(saved: Dict[str, str]) -> None:
    for name in [name for name in os.environ if name not in saved]:
        del os.environ[name]
    for name, value in saved.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _write_cwd(saved: str) -> None:
    try:
        same = os.getcwd() == saved
    except OSError:  # the model removed the directory it moved to
        same = False
    if not same:
        os.chdir(saved)


def settings_first() -> List[Setting]:
    """Given back before torch's settings: torch's setters may import modules (from sys.path)."""
    return [
        ("os.getcwd()", os.getcwd, _write_cwd),
        ("sys.path", lambda: list(sys.path), _write_path),
        ("sys.getrecursionlimit()", sys.getrecursionlimit, sys.setrecursionlimit),
    ]


def settings_last() -> List[Setting]:
    """Given back after torch's settings: some of torch's setters write environment variables
    (``torch.use_deterministic_algorithms`` sets TORCHINDUCTOR_CACHE_DIR)."""
    return [("os.environ", lambda: dict(os.environ), _write_environ)]
