"""The command line's fixed choices that belong to parts it should not import to parse arguments:
the probe's devices and backends (a check imports no probe, no measure layer and no torch).

The backends are ``eager`` and the compiled backends, one module each in measure/compilers/, found
by their file names: listing the folder imports none of them."""
from __future__ import annotations

import pathlib
import pkgutil
from typing import Tuple

PROBE_DEVICE_CHOICES = ("auto", "cuda", "cpu")
COMPILERS = pathlib.Path(__file__).resolve().parent.parent / "measure" / "compilers"


def compiled_backend_names() -> Tuple[str, ...]:
    """The compiled backends' names (their modules' in measure/compilers/), sorted."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules([str(COMPILERS)]) if not info.name.startswith("_")))


PROBE_BACKEND_CHOICES = ("eager", *compiled_backend_names())
