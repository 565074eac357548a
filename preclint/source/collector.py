"""Python's cyclic garbage collector, paused while one file is parsed and checked.

libcst builds millions of objects for a large file (a 16 MB test file: 11 GB of them), and CPython's
collector walks every object of a generation each time it collects that generation: while the tree
grows and the rules read it, each full collection costs more, and a check took more CPU a MB the
larger the file (15.5 s a MB at 4 MB, 20.5 s at 16 MB; parsing alone 2.6 times as long for twice the
text with the collector on, 2.1 times with it off). The tree holds no reference cycles (a node points
to its children only), so pausing frees nothing later than it would be freed anyway, except the few
cycles a check may make, which the collector finds once it runs again after the file.
"""
from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_paused = 0  # checks in progress that paused the collector (threads of one process may overlap)
_resume = False  # whether the collector was on before the first of them


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the duration, then as it was (on, unless someone turned it off)."""
    global _paused, _resume
    with _lock:
        if _paused == 0:
            _resume = gc.isenabled()
            gc.disable()
        _paused += 1
    try:
        yield
    finally:
        with _lock:
            _paused -= 1
            if _paused == 0 and _resume:
                gc.enable()
