"""The compiled backends: one module each in this package, named after the backend, found by its
name, so that a new backend (ONNX Runtime, TensorRT: docs/compiled.md) is one new module with nothing
to register. A backend module defines

    BACKEND      its measure.compiled.CompiledBackend subclass, whose ``name`` is the module's name

The command line lists the names without importing this package (core/choices.py reads the folder);
a backend's module, and torch with it, is imported when a run asks for it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from preclint.core.choices import PROBE_BACKEND_CHOICES, compiled_backend_names

if TYPE_CHECKING:
    from preclint.measure.compiled import CompiledBackend

DECLARED = ("BACKEND",)


def backend_named(name: str) -> "CompiledBackend":
    """A fresh backend called ``name`` (a module of this package)."""
    if name not in compiled_backend_names():
        raise ValueError(f"unknown backend {name!r} (choose from {', '.join(PROBE_BACKEND_CHOICES)})")
    return importlib.import_module(f"{__name__}.{name}").BACKEND()
