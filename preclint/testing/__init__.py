"""Tolerances for tests: what a comparison of a model's outputs under a precision can meet, and an
``assert_close`` that explains a failure (docs/api.md); ``pytest --preclint`` explains the failures
of a suite's own ``torch.testing.assert_close`` (preclint.testing.pytest_plugin, docs/testing.md).

    import preclint.testing

    tol = preclint.testing.tolerance(model, x, "tf32")          # predicted; probe="cpu"|"cuda": measured
    torch.testing.assert_close(out, expected, **tol.kwargs())
    preclint.testing.assert_close(out, expected, model=model, inputs=x, precision="tf32")

How the tolerance is chosen is documented in preclint.core.tolerances and preclint.testing.tolerances.

The names load on first use (PEP 562), so that importing the pytest plugin, which pytest does in
every suite where preclint is installed, imports neither torch nor the pipeline.
"""
import importlib

# name -> the module that defines it
_LAZY = {"CONFIDENCE": "preclint.core.tolerances", "MARGIN": "preclint.core.tolerances",
         "Difference": "preclint.testing.comparison", "assert_close": "preclint.testing.comparison",
         "OutputTolerance": "preclint.testing.tolerances", "Tolerance": "preclint.testing.tolerances",
         "MeetableTolerance": "preclint.testing.tolerances", "OutputBound": "preclint.testing.tolerances",
         "output_under": "preclint.testing.tolerances", "tolerance": "preclint.testing.tolerances"}

__all__ = sorted(_LAZY)


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'preclint.testing' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
