"""Tolerances for tests: what a comparison of a model's outputs under a precision can meet, and an
``assert_close`` that explains a failure (docs/api.md).

    import preclint.testing

    tol = preclint.testing.tolerance(model, x, "tf32")          # predicted; probe="cpu"|"cuda": measured
    torch.testing.assert_close(out, expected, **tol.kwargs())
    preclint.testing.assert_close(out, expected, model=model, inputs=x, precision="tf32")

How the tolerance is chosen is documented in preclint.core.tolerances and preclint.testing.tolerances.
"""
from preclint.core.tolerances import CONFIDENCE, MARGIN
from preclint.testing.comparison import Difference, assert_close
from preclint.testing.tolerances import OutputTolerance, Tolerance, output_under, tolerance

__all__ = ["CONFIDENCE", "MARGIN", "Difference", "OutputTolerance", "Tolerance", "assert_close", "output_under",
           "tolerance"]
