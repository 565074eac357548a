"""``assert_close`` that knows the precision the compared values were computed in.

It compares as ``torch.testing.assert_close`` does, with the tolerance the precision can meet
(``tolerance``), and when the comparison fails it says why: the precision and the error it puts on
the output, the layers that carry that error, whether the difference is the size the precision
explains (a comparison made too tight, or a kernel with larger error) or larger than it (a real
change: weights, inputs, code), and the tolerance that would pass.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import torch

from preclint.core.tolerances import MARGIN
from preclint.testing.modes import not_deterministic_text, train_mode_effect
from preclint.testing.tolerances import (PREDICTION_ONLY, OutputBound, MeetableTolerance, as_inputs,
                                         tolerance as meetable_tolerance)
from preclint.core.errors import UserError
from preclint.load.modelio import output_leaves
from preclint.report.document import ranked_ledger


@dataclass(frozen=True)
class Difference:
    """What a failed comparison of one output found."""

    name: str
    rms: float  # RMS of actual - expected
    largest: float
    failing: int  # elements outside atol + rtol |expected|
    numel: int
    passing_atol: float  # the smallest atol that passes at the tolerance's rtol
    times_sigma: float  # rms / the error the precision puts on the output

    def within_precision(self) -> bool:
        """Whether the difference is no larger than the precision explains: its RMS at most MARGIN
        times the error the precision puts on the output (a tolerance chosen with a smaller margin
        fails such differences, and they are still the precision's)."""
        return self.times_sigma <= MARGIN


def assert_close(actual: Any, expected: Any, *, model: torch.nn.Module, inputs: Any, precision: str,
                 probe: Optional[str] = None, tolerance: Optional[MeetableTolerance] = None, **kwargs: Any) -> None:
    """Assert that ``actual`` (``model``'s outputs on ``inputs`` computed under ``precision``, or
    one of them) is close to ``expected`` (the same recorded in float32), with the tolerance the
    precision can meet (``preclint.testing.tolerance(model, inputs, precision, probe=probe)``, or
    ``tolerance`` where given). Other keywords go to ``torch.testing.assert_close`` (``check_device``...);
    dtypes are not compared unless ``check_dtype=True``: a precision changes them (autocast returns
    bfloat16 where float32 was recorded), and the values are what is judged. A model in train mode
    whose mode changes its output is judged in it (its batch statistics: the tolerance measured in
    train mode); with dropout active the comparison is of two random draws, compared as torch
    compares them and, where that fails, said to be not deterministic.

    Tensors are matched to the model's outputs by their place where ``actual`` is the whole output,
    else by shape and closeness. On a failure the AssertionError carries torch's message and
    preclint's explanation (see the module's docstring)."""

    # the dtype is the precision's (autocast returns bfloat16 where float32 was recorded): values are compared
    kwargs.setdefault("check_dtype", False)
    # a model in train mode is judged in it: batch statistics measured so, dropout's draws not judged at all
    effect = train_mode_effect(model, as_inputs(inputs)) if tolerance is None else None
    if effect is not None and effect.random:
        try:
            torch.testing.assert_close(actual, expected, **kwargs)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n\n{not_deterministic_text(precision, 'given', effect)}") from None
        return
    tol = tolerance if tolerance is not None else meetable_tolerance(model, inputs, precision, probe=probe,
                                                                     keep_mode=effect is not None)
    got = [(path, t) for path, t in output_leaves(actual)]
    want = [(path, t) for path, t in output_leaves(expected)]
    if [p for p, _ in got] != [p for p, _ in want]:
        torch.testing.assert_close(actual, expected, **tol.kwargs(), **kwargs)  # torch says how they differ
        return
    names = {o.name for o in tol}
    for (path, a), (_, e) in zip(got, want):
        if not (isinstance(e, torch.Tensor) and e.is_floating_point()):
            torch.testing.assert_close(a, e, **kwargs)  # decisions, counts: compared exactly
            continue
        output = tol[f"output{path}"] if f"output{path}" in names else tol.for_expected(e)
        try:
            torch.testing.assert_close(a, e, rtol=output.rtol, atol=output.atol, **kwargs)
        except AssertionError as failure:
            found = difference(a, e, output)
            if not found.failing:
                raise  # not the values (a shape, a device): torch's message says all there is
            raise AssertionError(f"{failure}\n\n{explain(found, output, tol, model, inputs, probe)}") from None


def difference(actual: torch.Tensor, expected: torch.Tensor, output: OutputBound) -> Difference:
    """How ``actual`` differs from ``expected``, against the tolerance of ``output``."""
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if a.shape != e.shape:
        return Difference(output.name, math.inf, math.inf, e.numel(), e.numel(), math.inf, math.inf)
    d = (a - e).abs()
    finite = bool(torch.isfinite(d).all())
    rms = math.sqrt(float(d.pow(2).mean())) if finite and d.numel() else (0.0 if not d.numel() else math.inf)
    allowed = output.atol + output.rtol * e.abs()
    need = float((d - output.rtol * e.abs()).max()) if d.numel() else 0.0
    return Difference(output.name, rms, float(d.max()) if d.numel() else 0.0, int((~(d <= allowed)).sum()), d.numel(),
                      max(need, 0.0), rms / output.sigma if output.sigma > 0 else math.inf)


def explain(found: Difference, output: OutputBound, tol: MeetableTolerance, model, inputs, probe: Optional[str]) -> str:
    """The lines that say why a comparison under ``tol.precision`` failed."""
    precision = tol.precision
    how = "measured" if output.measured else "predicted"
    lines = [f"preclint: {found.name} computed under {precision}: {found.failing} of {found.numel} elements outside "
             f"rtol={output.rtol:.2e}, atol={output.atol:.2e} ({tol.source}).",
             f"  {precision} puts an error of RMS {output.sigma:.2e} on this output ({how}); the difference has "
             f"RMS {found.rms:.2e} ({found.times_sigma:.3g}x that) and at most {found.largest:.2e}."]
    layers = carrying_layers(tol, model, inputs, probe)
    if layers:
        lines.append(f"  The layers that carry {precision}'s error: "
                     + ", ".join(f"{name} ({share:.0%})" for name, share in layers) + ".")
    if found.within_precision():
        lines.append(f"  Within what {precision} explains (at most {MARGIN:g}x its error): a precision difference, "
                     f"not a change. atol={found.passing_atol:.2e} (rtol={output.rtol:.2e}) would pass.")
    else:
        lines.append(f"  {found.times_sigma:.3g}x the error {precision} explains, beyond the margin of {MARGIN:g}: "
                     "a real change (weights, inputs, code), not rounding. "
                     f"atol={found.passing_atol:.2e} would pass, and would hide it.")
    return "\n".join(lines)


def carrying_layers(tol: MeetableTolerance, model, inputs, probe: Optional[str], most: int = 3) -> List[Tuple[str, float]]:
    """(module, share of the output error) of the layers that carry most of the precision's error:
    measured by the probe's ledger where the tolerance was measured, else predicted."""
    from preclint.api import check  # lazy: looked up at each call, so that it can be replaced

    report = tol.report
    if report is None or (probe is not None and report.ledger is None):
        report = tol.explained.get(probe)
        if report is None:
            try:
                report = check(model, inputs, precisions=(tol.precision,), probe=probe, select=PREDICTION_ONLY)
            except UserError:
                return []
            tol.explained[probe] = report
    if report.ledger is not None:
        rows = ranked_ledger(report.ledger, tol.precision)
        shares = [(row["module"] or row["node"], row["modes"][tol.precision].get("contribution")) for row in rows]
        return [(name, share) for name, share in shares if share][:most]
    return [(module or node, share) for module, node, share in report.outputs[tol.precision].top_layers][:most]
