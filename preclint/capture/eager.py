"""The model's own ``torch.compile`` calls, run eagerly while preclint runs the model.

A model may compile parts of itself: a submodule wrapped by ``torch.compile``, a function decorated
with it. Run under preclint's recorder and hooks, Dynamo would trace them too (the hooks, the
function mode) and compile afresh for every pass, and what the check reads is what eager runs anyway
(`--backend inductor` measures compiled kernels). Under the compiler's ``force_eager`` stance every
such call runs its Python as written. Dynamo is only ever imported by a model that compiled
something, so a model that did not pays nothing here.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator


@contextlib.contextmanager
def compiled_code_eager() -> Iterator[None]:
    """Within: what the model compiled runs eagerly (nothing to do where Dynamo was never imported)."""
    if "torch._dynamo" not in sys.modules:
        yield
        return
    import torch

    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    if set_stance is None:  # torch before 2.6: no stance to take
        yield
        return
    with set_stance("force_eager"):
        yield
