"""The tolerance a comparison of a model's outputs under a precision can meet, per output.

``tolerance(model, inputs, "tf32")`` answers, for each float output of ``model(inputs)``, with the
rtol and atol that the output computed under TF32 (or fp16, bf16 autocast, a cast model) meets
against the same output computed in float32, and says how it chose them. The numbers follow
preclint.core.tolerances (where the choice is documented; PCL501 judges source code by them):

* ``sigma``, the RMS error of one element of the output, is *predicted* by the error model (the
  check's predicted relative output error times the output's RMS; the relative error is the
  model's over all its float outputs, so each output is given the same relative share), or, with
  ``probe="cpu"``/``"cuda"``, *measured*: the output under the precision (emulated on the CPU, native
  on the GPU) against a float64 reference, output by output, with its largest error.
* ``atol = margin * max(tail * sigma, largest)``: every element within it with 99% probability,
  and the estimate's uncertainty (margin 3) on top.
* ``rtol = 4u`` of the format the precision rounds dot products to (TF32 and fp16: 2.0e-3,
  bf16: 1.6e-2); a model's comparison rests on atol.

What it does not cover: decisions (argmax, top-k, thresholds, NMS) that flip on a small error
change values by far more than sigma; compare such outputs by what they decide.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch

from preclint.core.errors import UserError
from preclint.core.numerics import MODES
from preclint.core.tolerances import CONFIDENCE, MARGIN, Meetable, meetable
from preclint.rules import rule_named
from preclint.capture.global_state import preserved
from preclint.load.modelio import Inputs, output_leaves
from preclint.testing.recording import Recorder

# the rules a tolerance's check runs: the one that reads the predicted output error alone, so that
# the check computes what the prediction needs and nothing more
PREDICTION_ONLY = (rule_named("output-tolerance").code,)


@dataclass(frozen=True)
class OutputBound:
    """The tolerance one output meets under a precision.

    ``name``: the output's place in what the model returns (``output``, ``output['out']``,
    ``output[0]``); ``sigma``: the RMS error per element the precision puts on it, predicted or
    measured (``measured``); ``largest``: the largest error measured (None when predicted);
    ``value_rms``: the RMS of the output's float32 values."""

    name: str
    shape: Tuple[int, ...]
    rtol: float
    atol: float
    sigma: float
    value_rms: float
    numel: int
    margin: float
    measured: bool
    largest: Optional[float] = None
    why: str = ""

    def kwargs(self) -> Dict[str, float]:
        """``rtol`` and ``atol`` as ``torch.testing.assert_close`` takes them."""
        return {"rtol": self.rtol, "atol": self.atol}


@dataclass(frozen=True)
class MeetableTolerance:
    """The tolerance each float output of a model meets under ``precision`` (see the module's
    docstring for how it is chosen); ``rtol``/``atol``: the loosest of them, for one comparison of
    every output at once. Indexed by an output's name or position."""

    precision: str
    outputs: Tuple[OutputBound, ...]
    source: str  # "predicted by the error model", or where it was measured
    margin: float = MARGIN
    confidence: float = CONFIDENCE
    # the model's float32 outputs, which ``for_expected`` matches a compared tensor against
    reference: Tuple[torch.Tensor, ...] = field(default=(), repr=False, compare=False)
    report: Any = field(default=None, repr=False, compare=False)  # the check behind a prediction (preclint.Report)
    # the checks that named the layers of a failure, by probe device (None: predicted): made once
    explained: Dict[Optional[str], Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def rtol(self) -> float:
        return max((o.rtol for o in self.outputs), default=0.0)

    @property
    def atol(self) -> float:
        return max((o.atol for o in self.outputs), default=0.0)

    @property
    def measured(self) -> bool:
        return any(o.measured for o in self.outputs)

    def kwargs(self) -> Dict[str, float]:
        """``rtol`` and ``atol`` as ``torch.testing.assert_close`` takes them."""
        return {"rtol": self.rtol, "atol": self.atol}

    def __getitem__(self, key: Union[int, str]) -> OutputBound:
        if isinstance(key, int):
            return self.outputs[key]
        for output in self.outputs:
            if output.name == key or output.name == f"output[{key!r}]":
                return output
        raise KeyError(f"{key!r} is not an output of the model (its outputs: {', '.join(o.name for o in self.outputs)})")

    def __iter__(self) -> Iterator[OutputBound]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def for_expected(self, expected: torch.Tensor) -> OutputBound:
        """The output an ``expected`` tensor is a recording of: the one of its shape whose float32
        values it is closest to."""
        same = [(o, ref) for o, ref in zip(self.outputs, self.reference) if tuple(o.shape) == tuple(expected.shape)]
        if not same:
            shapes = ", ".join(f"{o.name} {list(o.shape)}" for o in self.outputs)
            raise UserError(f"a tensor of shape {list(expected.shape)} is none of the model's float outputs ({shapes}): "
                            "compare an output as the model returns it, or pass its tolerance")
        e = expected.detach().to("cpu", torch.float64)
        return min(same, key=lambda pair: float((pair[1] - e).pow(2).mean()))[0]

    def describe(self) -> str:
        """One line per output: its tolerance, and how it was chosen."""
        lines = [f"{self.precision} ({self.source}, margin {self.margin:g}):"]
        for o in self.outputs:
            lines.append(f"  {o.name} {list(o.shape)}: rtol={o.rtol:.2e}, atol={o.atol:.2e} "
                         f"(sigma {o.sigma:.2e}, {o.sigma / o.value_rms if o.value_rms else 0:.2e} of the values' RMS); {o.why}")
        return "\n".join(lines)


# the names docs/api.md gives users (``preclint.testing.Tolerance``, ``OutputTolerance``); the classes are named
# for what they are, apart from measure.compare.Tolerance (what a run must meet) and the rule PCL001
Tolerance = MeetableTolerance
OutputTolerance = OutputBound


def unit_roundoff(precision: str) -> float:
    """u of the format the precision rounds dot products' operands to."""
    return MODES[precision].dot_format.unit_roundoff


def tolerance(model: torch.nn.Module, inputs: Any, precision: str, *, probe: Optional[str] = None,
              margin: float = MARGIN, keep_mode: bool = False) -> MeetableTolerance:
    """The rtol/atol a comparison of ``model``'s outputs on ``inputs`` under ``precision`` (against
    its float32 outputs) can meet, per float output: predicted by the error model, or with
    ``probe`` ("cpu": emulated; "cuda": on the GPU) measured. ``margin``: the factor on the error
    estimate (3: see preclint.core.tolerances). The model's global state and modes are left as they
    were. ``keep_mode``: the model judged in the mode it is in (train mode: batch statistics), not in
    eval mode; measured then (on ``probe``, the CPU by default), since the error model predicts the
    model in eval mode. Raises UserError where the model cannot be checked."""

    if precision not in MODES:
        raise UserError(f"unknown precision {precision!r} (known: {', '.join(MODES)})")
    if not (isinstance(margin, (int, float)) and math.isfinite(margin) and margin > 0):
        raise UserError(f"margin must be a finite number > 0, not {margin!r}")
    with preserved():
        names, reference = reference_outputs(model, inputs, keep_mode=keep_mode)
        if probe is None and not keep_mode:
            return _predicted(model, inputs, precision, margin, (names, reference))
        return _measured(model, inputs, precision, margin, probe or "cpu", (names, reference), keep_mode=keep_mode)


def reference_outputs(model: torch.nn.Module, inputs: Any, *,
                      keep_mode: bool = False) -> Tuple[List[str], List[torch.Tensor]]:
    """(names, values) of the float outputs of the model in float32 as it is, in eval mode (``keep_mode``:
    a copy in the mode it is in, so that a batch norm's running statistics stay as they are), on the CPU."""
    from preclint.measure.copies import copy_to  # lazy: the plain check loads no probe/measure/plan

    with (contextlib.nullcontext() if keep_mode else evaluating(model)), torch.no_grad():
        output = as_inputs(inputs).call(copy_to(model, None) if keep_mode else model)
    leaves = [(f"output{path}", t) for path, t in output_leaves(output)
              if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not leaves:
        raise UserError(f"{type(model).__name__} returns no float tensor: there is no output to give a tolerance for")
    return [n for n, _ in leaves], [t.detach().to("cpu", torch.float64) for _, t in leaves]


def _predicted(model, inputs, precision: str, margin: float, outputs) -> MeetableTolerance:
    from preclint.api import check  # lazy: looked up at each call, so that it can be replaced

    report = check(model, inputs, precisions=(precision,), select=PREDICTION_ONLY)
    row = report.outputs[precision]
    if row.finite is False:
        raise UserError(f"under {precision} {type(model).__name__}'s output is predicted to overflow to inf/NaN: "
                        "no tolerance can pass (see preclint.check's findings)")
    if row.rel_error is None:
        raise UserError(f"{type(model).__name__}: no output error could be predicted under {precision} "
                        f"({'; '.join(report.notes) or 'see preclint.check'})")
    u = unit_roundoff(precision)
    found = []
    for name, ref in zip(*outputs):
        rms = _rms(ref)
        bound = meetable(row.rel_error * rms, ref.numel(), u, margin=margin)
        found.append(_output(name, ref, rms, bound, measured=False,
                             why=f"sigma = predicted relative error {row.rel_error:.2e} x RMS; " + bound.why))
    return MeetableTolerance(precision, tuple(found), "predicted by the error model", margin, CONFIDENCE,
                     tuple(outputs[1]), report)


def _measured(model, inputs, precision: str, margin: float, probe: str, outputs, *, keep_mode: bool = False) -> MeetableTolerance:
    from preclint.measure.runners import run_reference  # lazy: the plain check loads no probe/measure/plan
    from preclint.probe.device import select_device  # lazy: the plain check loads no probe/measure/plan

    device = select_device(probe)
    with (contextlib.nullcontext() if keep_mode else evaluating(model)):
        actual = output_under(model, inputs, precision, device=str(device), keep_mode=keep_mode)
        reference = run_reference(model, as_inputs(inputs), device)  # (a float64 copy, in the same mode)
    pairs = [(a, r) for (_, a), (_, r) in zip(output_leaves(actual), output_leaves(reference))
             if isinstance(r, torch.Tensor) and r.is_floating_point()]
    u = unit_roundoff(precision)
    where = f"measured on {device}" + (" (emulated)" if device.type == "cpu" else "") \
        + (", in train mode as the model was called" if keep_mode and any(m.training for m in model.modules()) else "")
    found = []
    for name, ref32, (a, r) in zip(outputs[0], outputs[1], pairs):
        d = a.detach().double().cpu() - r.detach().double().cpu()
        if not bool(torch.isfinite(d).all()):
            raise UserError(f"under {precision} {name} of {type(model).__name__} is inf/NaN where float64's is "
                            "finite: no tolerance can pass")
        sigma, largest = _rms(d), float(d.abs().max()) if d.numel() else 0.0
        bound = meetable(sigma, d.numel(), u, margin=margin, largest=largest)
        found.append(_output(name, ref32, _rms(ref32), bound, measured=True,
                             why=f"sigma = RMS error {where}; " + bound.why))
    return MeetableTolerance(precision, tuple(found), where, margin, CONFIDENCE, tuple(outputs[1]))


def _output(name: str, ref: torch.Tensor, rms: float, bound: Meetable, *, measured: bool, why: str) -> OutputBound:
    return OutputBound(name, tuple(ref.shape), bound.rtol, bound.atol, bound.sigma, rms, bound.numel, bound.margin,
                           measured, bound.largest, why)


def _rms(t: torch.Tensor) -> float:
    return math.sqrt(float(t.double().pow(2).mean())) if t.numel() else 0.0


def output_under(model: torch.nn.Module, inputs: Any, precision: str, *, device: Optional[str] = None,
                 keep_mode: bool = False) -> Any:
    """What ``model`` returns on ``inputs`` under ``precision``: on a GPU the precision itself (TF32
    switched on, autocast, the model cast), on the CPU emulated by rounding as a GPU rounds. A
    float32 copy of the model runs on ``device`` (None: the device of its first parameter), in eval
    mode (``keep_mode``: in the mode the model is in); the model and the process's settings are left as
    they were."""
    from preclint.measure.copies import copy_to  # lazy: the plain check loads no probe/measure/plan
    from preclint.measure.runners import run_mode  # lazy: the plain check loads no probe/measure/plan

    if precision not in MODES:
        raise UserError(f"unknown precision {precision!r} (known: {', '.join(MODES)})")
    if device is None:
        device = str(next((p.device for p in model.parameters()), torch.device("cpu")))

    with preserved(), (contextlib.nullcontext() if keep_mode else evaluating(model)):
        copy = copy_to(model, torch.device(device), torch.float32)
        output = run_mode(copy, as_inputs(inputs), precision, device)
    if Recorder.active is not None:  # pytest --preclint is watching the test: this is the model's output
        Recorder.active.note(model, as_inputs(inputs), output, precision)
    return output


def as_inputs(inputs: Any):
    """``inputs`` as one call (load.modelio.Inputs): a tensor, a tuple or list of positional inputs,
    a dict of keyword inputs, or Inputs."""

    if isinstance(inputs, Inputs):
        return inputs
    if isinstance(inputs, (tuple, list)):
        return Inputs(tuple(inputs))
    if isinstance(inputs, dict):
        return Inputs((), dict(inputs))
    return Inputs((inputs,))


class evaluating:
    """``model`` in eval mode for the body, each submodule's mode given back after."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.modes: List[Tuple[torch.nn.Module, bool]] = []

    def __enter__(self) -> None:
        self.modes = [(m, m.training) for m in self.model.modules()]
        self.model.eval()

    def __exit__(self, *exc_info) -> None:
        for m, mode in self.modes:
            m.training = mode
