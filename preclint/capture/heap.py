"""Python's garbage collector during preclint's passes.

A pass over a large model makes tens of thousands of small objects (nodes, figures, operand tuples),
and as they pile up the collector runs full collections, each walking every object the process holds:
the model's modules and parameters, and the libraries it imported (400 000 objects for a model built
with transformers). On a 7B-shaped Llama's graph on the CPU those full collections were a share of
check and probe worth removing (a measurement that kept no result file). What existed before the pass
(the loaded model, the imports) outlives it, so while a pass runs it is moved out of the collector's
sight (``gc.freeze``) and handed back afterwards; the pass's own garbage is collected as ever.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

_depth = 0


@contextlib.contextmanager
def long_lived_frozen() -> Iterator[None]:
    """Full collections skip the objects that exist on entry, until exit (nested uses share the
    outermost one). A process that froze objects itself keeps its own arrangement: its frozen
    objects would otherwise be handed back to the collector on exit."""
    global _depth
    if _depth == 0 and (gc.get_freeze_count() or not gc.isenabled()):
        yield
        return
    if _depth == 0:
        gc.freeze()
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.unfreeze()
