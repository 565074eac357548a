"""The tolerance a comparison can meet: the rtol and atol of ``|actual - expected| <= atol + rtol * |expected|``
(torch.testing.assert_close's and torch.isclose's criterion) that values computed under a precision meet
against their float32 (or float64) counterparts, from the size of the error the precision puts on them.

Torch-free: the source rule PCL501, which never imports torch, and preclint.testing, which reads a
model's predicted or measured error, take their numbers from here.

How the numbers are chosen (the error model, docs/error-model.md):

* An element's error is close to Gaussian with an RMS ``sigma`` that is the same for every element of
  an output whatever the element's own size: a dot product's rounding scales with the size of its
  terms, not of its result, and a model's output error sums many such roundings. An element near zero
  carries as much error as a large one, so ``atol`` must cover ``sigma`` and no ``rtol`` can.
* ``atol = margin * max(tail * sigma, largest)``: ``tail = sqrt(2 ln(2 n / (1 - CONFIDENCE)))`` bounds
  the largest |error| of ``n`` Gaussian elements with probability CONFIDENCE (the union bound on the
  tail, ``P(|e| > t sigma) <= 2 exp(-t^2 / 2)``); ``largest`` is the largest error a run measured, for a
  measured ``sigma``; ``margin`` (MARGIN, 3) covers the estimate of ``sigma`` itself: the predicted
  output error lies within 3x of the one measured on an H200 for 115 of 118 (model, mode) pairs, and
  the error emulated on a CPU within 3x of the H200's for every pair measured on both
  (benchmarks/CLAIMS.md).
* ``rtol = RTOL_UNITS * u`` (4u, u the unit roundoff of the format the dot products round their operands
  to): an element's own value is rounded at most twice on its way out (computed, stored or cast), u
  each, and the margin doubles that. It loosens the check for large elements only: the comparison of
  a whole model rests on ``atol``.
* Below ``RESOLUTION_UNITS * u`` (2u) an rtol fails a correct result outright: two roundings of u each
  are what its elements carry.

A check in source code (PCL501) knows neither the model nor the size of the values: it judges against
one op's error, ``sigma = sqrt(C_INPUT^2 + C_OUTPUT^2) * u`` times the RMS of the values (two operands
rounded and the result stored, nothing compounded), over ONE_OP_NUMEL elements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from preclint.core.numerics import C_INPUT, C_OUTPUT

MARGIN = 3.0  # the error estimate's own uncertainty (see the module's docstring)
CONFIDENCE = 0.99  # the probability that every element of an output meets the atol
RTOL_UNITS = 4  # rtol = 4u
RESOLUTION_UNITS = 2  # an rtol below 2u fails a correct result
ONE_OP_NUMEL = 4096  # the elements a check in source code is taken to compare (a 64 x 64 output)
ONE_OP_ERROR = math.hypot(C_INPUT, C_OUTPUT)  # one op's relative RMS error, in units of u (0.73)


def tail_factor(numel: int, confidence: float = CONFIDENCE) -> float:
    """How many RMS errors the largest |error| of ``numel`` Gaussian elements stays under with
    probability ``confidence``: sqrt(2 ln(2 n / (1 - confidence)))."""
    return math.sqrt(2.0 * math.log(2.0 * max(int(numel), 1) / (1.0 - confidence)))


@dataclass(frozen=True)
class Meetable:
    """The tolerance values with RMS error ``sigma`` over ``numel`` elements meet, and how it was chosen."""

    rtol: float
    atol: float
    sigma: float  # the RMS error per element the atol covers
    numel: int
    margin: float
    tail: float  # tail_factor(numel)
    largest: Optional[float] = None  # the largest error measured, where sigma was measured

    @property
    def why(self) -> str:
        """One line: how atol follows from sigma."""
        base = f"{self.tail:.2f} x sigma, the largest of {self.numel} Gaussian errors at {CONFIDENCE:.0%}"
        if self.largest is not None and self.largest > self.tail * self.sigma:
            base = f"the largest error measured ({self.largest:.3g}, above {self.tail:.2f} x sigma)"
        return f"atol = {self.margin:g} x {base}; rtol = {RTOL_UNITS}u"


def meetable(sigma: float, numel: int, unit_roundoff: float, *, margin: float = MARGIN,
             largest: Optional[float] = None) -> Meetable:
    """The rtol and atol that values whose elements err by ``sigma`` (RMS, absolute) meet, over
    ``numel`` elements, for a format of unit roundoff ``unit_roundoff``; ``largest``: the largest
    |error| a run measured, which the atol covers too."""
    tail = tail_factor(numel)
    atol = margin * max(tail * sigma, largest or 0.0)
    return Meetable(RTOL_UNITS * unit_roundoff, atol, sigma, int(numel), margin, tail, largest)


def one_op(unit_roundoff: float) -> Meetable:
    """The tolerance one op's result meets in a format of unit roundoff ``unit_roundoff``, with atol in
    units of the RMS of the compared values (what a check in source code is judged against)."""
    return meetable(ONE_OP_ERROR * unit_roundoff, ONE_OP_NUMEL, unit_roundoff)


def resolution(unit_roundoff: float) -> float:
    """The rtol below which a correct result fails outright."""
    return RESOLUTION_UNITS * unit_roundoff


def failing_fraction(sigma: float, y_rms: float, rtol: float, atol: float) -> float:
    """Expected fraction of elements with |error| > atol + rtol*|y|.

    Models the output as N(0, y_rms^2) and its error as N(0, sigma^2), independent: the fraction is
    E_y[erfc((atol + rtol |y|) / (sigma sqrt 2))], integrated over |y| with the trapezoid rule.
    """
    if sigma <= 0:
        return 0.0
    steps, top = 400, 8.0
    total = 0.0
    for i in range(steps + 1):
        z = top * i / steps
        weight = 0.5 if i in (0, steps) else 1.0
        density = math.sqrt(2.0 / math.pi) * math.exp(-0.5 * z * z)
        total += weight * density * math.erfc((atol + rtol * y_rms * z) / (sigma * math.sqrt(2.0)))
    return total * top / steps


def passing_atol(sigma: float, numel: int, confidence: float = 0.99) -> float:
    """An atol that every element meets with the given probability, whatever rtol is."""
    return sigma * math.sqrt(2.0 * math.log(2.0 * max(numel, 1) / (1.0 - confidence)))
