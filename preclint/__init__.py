"""preclint: a precision linter for PyTorch models.

The Python API (docs/api.md) is loaded on first use, so that ``import preclint`` stays cheap and
needs no torch (the source-only check runs without it):

    preclint.check(model, inputs, precisions=("tf32",))    # preclint.api
    preclint.testing.tolerance(model, inputs, "tf32")      # preclint.testing
    with preclint.watch(model, optimizer): ...             # preclint.training.watch_entry
"""
import importlib

__version__ = "0.1.0"

# name -> the module that defines it (PEP 562: imported when first asked for)
_LAZY = {"check": "preclint.api", "inputs": "preclint.api", "Report": "preclint.api", "OutputError": "preclint.api",
         "training_step": "preclint.api", "watch": "preclint.training.watch_entry",
         "watch_report": "preclint.report.watch_html",
         "UserError": "preclint.core.errors"}
_SUBMODULES = ("api", "testing")

__all__ = ["__version__", *_LAZY, *_SUBMODULES]


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"preclint.{name}")
    raise AttributeError(f"module 'preclint' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
