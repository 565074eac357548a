"""A run's outputs against the reference's: one record of what a precision did to them.

``compare`` judges a run at once, on tensors it reads back: the plan's verifier, the accuracy
benchmark and the tests' oracle use it. The probe issues the same figures on the device and reads
them back after every mode has run (probe/readback.py), from the differences ``output_differences``
and the decisions ``integer_pairs`` pair up here.

Outputs are compared position by position, in the order ``output_tensors`` numbers them (pytree
order, dataclasses and ModelOutputs included). As in torch.testing, each criterion says why it is
what it is where it is computed.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import torch

from preclint.core.findings import ErrorFigure
from preclint.load.modelio import output_tensors
from preclint.measure.detections import detection_tensor_ids


@dataclass(frozen=True)
class Tolerance:
    """What a run must meet: ``|out - ref| <= atol + rtol * |ref|`` elementwise where either is
    given, and at most ``max_flip`` of its decisions changed."""

    rtol: Optional[float] = None
    atol: Optional[float] = None
    max_flip: Optional[float] = None  # fraction of decisions (argmax, thresholds, top-k) allowed to change

    @property
    def compares_values(self) -> bool:
        return self.rtol is not None or self.atol is not None

    def bounds(self) -> Tuple[float, float]:
        """(rtol, atol) as torch.isclose takes them: a bound not given is 0, so that the other alone judges."""
        return self.rtol or 0.0, self.atol or 0.0


@dataclass(frozen=True)
class NonFinite:
    """The first value of a run that is inf or NaN where the reference's is finite (or the first
    where their difference is not finite)."""

    output: int  # position among the outputs compared
    index: int  # position in the output, flattened
    value: float  # the run's value there


@dataclass(frozen=True)
class Comparison:
    """A run's outputs against the reference's: the error figure, and the verdict on it.

    ``figure``: ``rel_error`` is relative_rms over every float output (None: not finite, or no scale),
    ``max_abs_error`` the largest |out - ref| (None where not finite), ``finite``, ``failing_fraction``
    the elements outside atol + rtol |ref| (None without rtol or atol) and ``flip_fraction`` the largest
    fraction of changed decisions over the outputs judged."""

    figure: ErrorFigure
    decisions: int  # the decisions judged: integer elements, and rows of class scores under a flip budget
    first_nonfinite: Optional[NonFinite]
    meets: bool  # within the tolerance: finite, no failing element, flips within the budget

    # the figure's fields under the names the measuring code reads them by
    @property
    def rel_rms(self) -> Optional[float]:
        return self.figure.rel_error

    @property
    def max_abs(self) -> Optional[float]:
        return self.figure.max_abs_error

    @property
    def finite(self) -> bool:
        return bool(self.figure.finite)

    @property
    def failing_fraction(self) -> Optional[float]:
        return self.figure.failing_fraction

    @property
    def flip_fraction(self) -> Optional[float]:
        return self.figure.flip_fraction


def compare(outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor],
            tolerance: Tolerance = Tolerance()) -> Comparison:
    """``outputs`` (a run's output tensors) against ``reference`` (the same model's in float64, or any
    run the decisions are judged against), position by position."""
    rtol, atol = tolerance.bounds()
    if len(outputs) != len(reference):
        # another number of outputs: nothing corresponds, every decision counts as changed
        return Comparison(ErrorFigure(None, None, 1.0, finite=True), 0, None, False)
    max_abs = 0.0
    failing = numel = decisions = 0
    finite = True
    first: Optional[NonFinite] = None
    flips: List[float] = []
    floats: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for position, (out, ref) in enumerate(zip(outputs, reference)):
        if out.shape != ref.shape:
            # detections: another number of boxes; the units of the two runs do not correspond
            flips.append(1.0)
            continue
        if not ref.is_floating_point():
            # indices, labels, masks: each element is a decision that holds or changes
            flips.append(float((out != ref).float().mean()) if ref.numel() else 0.0)
            decisions += ref.numel()
            continue
        d = out.double() - ref
        if not bool(torch.isfinite(d).all()):
            # an inf or NaN has no size: the run is judged not finite and this output adds no figure
            finite = False
            if first is None:
                first = _first_nonfinite(position, out, d)
            continue
        floats.append((out, ref))
        max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
        # torch.isclose's criterion: atol covers values near zero, where no relative bound can hold
        failing += int((d.abs() > atol + rtol * ref.abs()).sum())
        numel += d.numel()
        if ref.dim() >= 2 and ref.shape[-1] > 1 and tolerance.max_flip is not None:
            # class scores (a last dim of several entries) decide their argmax: judged under a flip budget only
            flips.append(float((out.argmax(-1) != ref.argmax(-1)).float().mean()))
            decisions += ref[..., 0].numel()
    # a run with no float output has nothing off in its values (its decisions are judged above)
    rel = relative_rms(*zip(*floats)) if floats else 0.0
    fraction = failing / numel if numel and tolerance.compares_values else None
    flip = max(flips) if flips else None
    budget = tolerance.max_flip if tolerance.max_flip is not None else 0.0  # no budget: no decision may change
    meets = finite and (not failing or not tolerance.compares_values) and (flip is None or flip <= budget)
    figure = ErrorFigure(rel if finite else None, max_abs if finite else None, flip, finite=finite,
                         failing_fraction=fraction)
    return Comparison(figure, decisions, first, meets)


# What an inf or NaN does to a relative error depends on what the figure is for.
# UNKNOWN: the size of an error (a precision's, a backend's). An inf or NaN has no size, so there is no
#   figure (None); whether the run stayed finite is reported beside it (Comparison.finite).
# LARGEST: whether two runs agree (diff's two settings, two train-mode calls). The same inf, or NaN in
#   both, agrees and adds nothing; an inf or NaN in one run and not the same in the other is the largest
#   difference there is (inf), not an unknown one.
UNKNOWN = "unknown"
LARGEST = "largest"


def relative_rms(outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor], *,
                 nonfinite: str = UNKNOWN) -> Optional[float]:
    """||out - ref||_2 / ||ref||_2 over the float tensors of ``outputs`` and ``reference`` that correspond
    (position by position, equal shapes), in float64: the one relative error preclint reports.

    Tensors that do not correspond add nothing: integers and bools are decisions, and float tensors
    of other shapes are detection sets; ``compare`` judges both apart. None where nothing corresponds,
    where an inf or NaN has no size (``nonfinite``, above), and where the reference is all zeros and
    the run is not: such a reference has no scale for an error to be relative to (an exact run is 0 off).
    """
    sq_d = sq_r = 0.0
    seen = False
    for o, r in zip(outputs, reference):
        if not (o.is_floating_point() and r.is_floating_point()) or o.shape != r.shape:
            continue
        # float64: a float32 sum of squares over a large output would carry a rounding error of its own
        o64 = o.detach().double()
        r64 = r.detach().to(o64.device, torch.float64)
        d = o64 - r64
        if nonfinite == UNKNOWN:
            if not bool(torch.isfinite(d).all()):
                return None
        else:
            finite = torch.isfinite(o64) & torch.isfinite(r64)
            alike = (o64 == r64) | (torch.isnan(o64) & torch.isnan(r64))  # the same inf, or NaN in both
            if bool((~finite & ~alike).any()):
                return math.inf
            d = torch.where(finite, d, torch.zeros_like(d))
            r64 = torch.where(finite, r64, torch.zeros_like(r64))
        sq_d += float((d * d).sum())
        sq_r += float((r64 * r64).sum())
        seen = True
    if not seen:
        return None
    if sq_r == 0:
        return 0.0 if sq_d == 0 else None
    return math.sqrt(sq_d / sq_r)


def _first_nonfinite(position: int, out: torch.Tensor, d: torch.Tensor) -> NonFinite:
    index = int(torch.nonzero(~torch.isfinite(d.flatten()))[0])
    return NonFinite(position, index, float(out.flatten()[index]))


# ------------------------------------------------------------------ the probe's output differences


@dataclass
class OutputDifferences:
    """The model's float outputs against the reference's, in pytree order."""

    errors: List[Optional[torch.Tensor]]  # None where an output is not compared element by element
    references: List[torch.Tensor]

    def present(self) -> List[torch.Tensor]:
        return [e for e in self.errors if e is not None]


def output_differences(output: Any, reference: Any) -> OutputDifferences:
    """Each float output of ``output`` minus the reference's (``reference``: the float64 run's
    output), in float64; detection sets are compared by matching instead (detections.py)."""
    outs = [t for t in output_tensors(output) if t.is_floating_point()]
    refs = [t for t in output_tensors(reference) if t.is_floating_point()]
    matched = detection_tensor_ids(output)
    errors = [o.detach().double() - r if o.shape == r.shape and id(o) not in matched else None
              for o, r in zip(outs, refs)]
    return OutputDifferences(errors, refs)


def integer_pairs(output: Any, reference: Any) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """(run, reference) of each integer or bool output (the decisions), detection sets left out."""
    matched = detection_tensor_ids(output)
    outs = [t for t in output_tensors(output) if not t.is_floating_point()]
    refs = [t for t in output_tensors(reference) if not t.is_floating_point()]
    return [(o, r) for o, r in zip(outs, refs) if id(o) not in matched]
