"""Python's garbage collector during preclint's passes.

A pass over a large model makes tens of thousands of small objects (nodes, figures, operand tuples),
and as they pile up the collector runs full collections, each walking every object the process holds:
the model's modules and parameters, and the libraries it imported (400 000 objects for a model built
with transformers). On a 7B-shaped Llama's graph on the CPU those full collections were a share of
check and probe worth removing (a measurement that kept no result file). What existed before the pass
(the loaded model, the imports) outlives it, so while a pass runs it is moved out of the collector's
sight (``gc.freeze``) and handed back afterwards. The pass's own objects then still cost collections:
the youngest generation is collected every 700 allocations, every tenth of those collects the next
one too, and full collections follow as the pass's objects pile up (check and probe of
the narrow Llama in benchmarks/large_models.py: 0.37 s of collections, 0.17 s with the youngest
generation collected every 10 000). So the pass collects its youngest objects that much less often;
cyclic garbage is still found within 10 000 allocations.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Iterator

_depth = 0
PASS_THRESHOLD = 10_000  # allocations between collections of the youngest generation while a pass runs


@contextlib.contextmanager
def long_lived_frozen() -> Iterator[None]:
    """Full collections skip the objects that exist on entry, until exit (nested uses share the
    outermost one). A process that froze objects itself keeps its own arrangement: its frozen
    objects would otherwise be handed back to the collector on exit."""
    global _depth
    if _depth == 0 and (gc.get_freeze_count() or not gc.isenabled()):
        yield
        return
    thresholds = gc.get_threshold()
    if _depth == 0:
        gc.freeze()
        gc.set_threshold(max(thresholds[0], PASS_THRESHOLD), *thresholds[1:])
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
        if _depth == 0:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
