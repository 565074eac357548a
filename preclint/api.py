"""preclint from Python: one call that checks a model, for notebooks and test suites.

    import preclint

    report = preclint.check(model, torch.randn(1, 3, 224, 224), precisions=("tf32",), probe="cpu")
    report.findings                 # the findings, as `preclint check` lists them
    report.outputs["tf32"]          # the output error: predicted, and measured with a probe
    report.ledger                   # with a probe: every node's measured error and share
    report.to_json()                # the document `--output-format json` writes
    report                          # in a notebook: the page `--output-format html` writes

The call walks the model through the same pipeline as the command line (preclint.engine.Session),
so the numbers are the ones `preclint check` prints for it. It leaves the process as it found it,
whatever the model's code did (preclint.capture.global_state; docs/api.md lists it all): the working
directory, sys.path, the environment, the random generators, the default dtype, the TF32 settings
(through the API each is read with), the backend flags, autocast, grad mode, the number of threads,
torch's function and dispatch modes, the global module hooks and the compiler config modules; and the
model's submodules get their training modes back.

A mistake in the call or a model that cannot be checked raises :class:`preclint.UserError`, with
the one line the command line would print.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple, Union

from preclint.core.errors import UserError
from preclint.core.findings import ErrorFigure
from preclint.core.notes import texts
from preclint.core.numerics import DEFAULT_MODES
from preclint.capture.global_state import preserved
from preclint.config import Config
from preclint.engine import CheckOptions, LoadOptions, PlanOptions, Session
from preclint.load.modelio import Inputs
from preclint.load.training import training_step_of, TrainingStep
from preclint.report import render_reports
from preclint.report.formats import names

if TYPE_CHECKING:
    import torch

    from preclint.core.findings import Finding
    from preclint.plan.document import Plan
    from preclint.report import Report as Document

__all__ = ["OutputError", "Report", "UserError", "check", "inputs", "training_step"]

PROBE_DEVICES = ("cpu", "cuda", "auto")


def inputs(*args: Any, **kwargs: Any):
    """The inputs of one call of a model, ``model(*args, **kwargs)``, for a model that takes keywords:
    ``preclint.check(model, preclint.inputs(ids, attention_mask=mask))``."""

    return Inputs(tuple(args), dict(kwargs))


def training_step(*, loss_fn=None, targets=None, make_optimizer=None, optimizer=None, scaler=None, batch=None):
    """The training step of a model already built, for ``preclint.check(model, inputs, train=...)``: the loss
    (``loss_fn(output, targets)``; None: the model returns its loss), the optimizer (``make_optimizer(params)``,
    or an optimizer whose class and hyperparameters are reused) and an optional ``torch.amp.GradScaler``.
    ``batch``: a Lightning module's example batch: the loss is its ``training_step(batch, 0)`` and the
    optimizer, unless given, its ``configure_optimizers()``'s (docs/training.md, "PyTorch Lightning")."""

    return training_step_of(loss_fn=loss_fn, targets=targets, make_optimizer=make_optimizer, optimizer=optimizer,
                            scaler=scaler, batch=batch, label="preclint.training_step")


@dataclass(frozen=True)
class OutputError:
    """One row of the report's output table: the error a precision puts on the model's output,
    ``predicted`` and, with a probe, ``measured`` against a float64 reference (None without one).

    ``rel_error``: RMS(error) / RMS(output) over every float output; ``max_abs_error``: the largest
    absolute error; ``finite``: False where the output becomes inf or NaN (None: not predicted).
    ``measured_*`` are the same read from ``measured`` (None without a probe).
    ``top_layers``: (module, node, share of the output error) of the layers predicted to hold most of it.
    """

    precision: str
    predicted: ErrorFigure
    measured: Optional[ErrorFigure] = None
    top_layers: Tuple[Tuple[str, str, float], ...] = ()

    @property
    def rel_error(self) -> Optional[float]:
        return self.predicted.rel_error

    @property
    def max_abs_error(self) -> Optional[float]:
        return self.predicted.max_abs_error

    @property
    def finite(self) -> Optional[bool]:
        return self.predicted.finite

    @property
    def measured_rel_error(self) -> Optional[float]:
        return None if self.measured is None else self.measured.rel_error

    @property
    def measured_max_abs_error(self) -> Optional[float]:
        return None if self.measured is None else self.measured.max_abs_error

    @property
    def measured_finite(self) -> Optional[bool]:
        return None if self.measured is None else self.measured.finite

    @property
    def measured_flip_fraction(self) -> Optional[float]:
        return None if self.measured is None else self.measured.flip_fraction


class Report:
    """What ``check`` found for one model: the findings, the output table, the ledger (with a probe),
    the plan (with ``plan=True``), and the same document in each output format."""

    def __init__(self, document: "Document", plan: "Optional[Plan]" = None,
                 environment: Optional[Dict[str, Any]] = None) -> None:
        self.document = document  # the Report every output format converts (preclint.report)
        self.plan = plan
        self._environment = environment  # where the predictions ran, for the page (no probe)

    @property
    def model(self) -> Optional[str]:
        return self.document.model

    @property
    def precisions(self) -> Tuple[str, ...]:
        return tuple(self.document.precisions)

    @property
    def findings(self) -> "List[Finding]":
        """The findings, sorted as every format lists them (path, line, column, code)."""
        return self.document.sorted_findings()

    @property
    def notes(self) -> List[str]:
        return texts(self.document.notes) + list(self.document.caveats)

    @property
    def ledger(self) -> Optional[List[Dict[str, Any]]]:
        """With a probe: per node in execution order, its measured errors per precision (``local``,
        ``received``, ``contribution`` to the output error...), as `preclint probe` lists them."""
        return self.document.ledger

    @property
    def outputs(self) -> Dict[str, OutputError]:
        """The output table, by precision."""
        rows = {}
        for mode in self.precisions:
            entry = self.document.summary.get(mode, {})
            predicted = entry.get("predicted_output", {})
            measured = entry.get("measured_output")
            rows[mode] = OutputError(
                mode, _figure_of(predicted), _figure_of(measured) if measured else None,
                tuple((t.get("module") or "", t.get("node") or "", t["share"]) for t in entry.get("top_layers", [])))
        return rows

    def render(self, fmt: str = "full", color: bool = False) -> str:
        """The report in one of the command line's output formats (full, concise, json, sarif,
        github, rdjson, html), byte for byte what ``--output-format fmt`` writes."""

        if fmt not in names():
            raise UserError(f"unknown output format {fmt!r} (choose from {', '.join(names())})")
        if fmt == "html":
            return self._repr_html_()
        return render_reports([self.document], fmt, color)

    def to_dict(self) -> Dict[str, Any]:
        """The JSON document as Python values."""
        import json

        return json.loads(self.to_json())

    def to_json(self) -> str:
        """The document `preclint check --output-format json` writes (with a probe: `preclint probe
        --output-format json`, the ledger included). The plan's own document is ``plan.to_json()``."""
        return self.render("json")

    def _repr_html_(self) -> str:
        """The page `--output-format html` writes (`preclint plan --output-format html` with a plan)."""
        document = self.document
        if document.environment is None and self._environment is not None:
            document = replace(document, environment=self._environment)
        if self.plan is not None:
            from preclint.plan.command import render_plan  # lazy: the plain check loads no probe/measure/plan

            return render_plan(document, self.plan, "html")

        return render_reports([document], "html")

    def __repr__(self) -> str:
        errors = ", ".join(f"{m} {_figure(row)}" for m, row in self.outputs.items())
        return (f"<preclint.Report {self.model}: {len(self.findings)} finding(s); output error {errors or 'n/a'}"
                f"{'; ledger' if self.ledger is not None else ''}{'; plan' if self.plan is not None else ''}>")


def _figure_of(entry: Dict[str, Any]) -> ErrorFigure:
    """The summary's output entry (report/summary.py, or the probe's measured one) as the figure it records."""
    return ErrorFigure(entry.get("rel_error"), entry.get("max_abs_error"), entry.get("flip_fraction"),
                       finite=entry.get("finite"))


def _figure(row: OutputError) -> str:
    shown = "n/a" if row.rel_error is None else f"{row.rel_error:.2e}"
    if row.measured_rel_error is not None:
        shown += f" (measured {row.measured_rel_error:.2e})"
    return shown


def check(model: Union["torch.nn.Module", str], inputs: Any = None, *,
          precisions: Sequence[str] = DEFAULT_MODES, rtol: Optional[float] = None, atol: Optional[float] = None,
          probe: Optional[str] = None, plan: bool = False, select: Optional[Sequence[str]] = None,
          ignore: Sequence[str] = (), timeout: float = 0.0, train: Any = False) -> Report:
    """Check ``model`` for where reduced precision changes its numbers.

    ``model``: an ``nn.Module`` called on ``inputs`` (a tensor, a tuple or list of positional
    inputs, a dict of keyword inputs, or ``preclint.inputs(*args, **kwargs)``), or the path of a
    model file as the command line takes it (its inputs come from the file). ``precisions``: among
    tf32, fp16, bf16, fp16-full, bf16-full. ``rtol``/``atol``: the tolerance the outputs are compared
    with (PCL001 judges it, as ``--rtol``/``--atol`` do). ``probe``: None to predict only, "cpu" to
    measure with the precisions emulated on the CPU, "cuda" on the GPU ("auto": the GPU if there is
    one); the report then holds the ledger. ``plan``: also make the plan of the fewest layers to keep
    in float32 that meets the tolerance (one precision, and rtol/atol), verified on the probe's device
    (on "auto" without a probe), as `preclint plan` makes it. ``select``/``ignore``: rule codes or
    prefixes, as ``--select``/``--ignore``. ``timeout``: seconds the walk may take (0: no limit), from any
    thread (off the main thread a watchdog raises in the calling thread; docs/api.md).
    ``train``: also check one training step (``--train``, docs/training.md): True for a path whose file gives
    it, or ``preclint.training_step(...)`` for a model already built.

    Configuration files are not read (the command line's ``--isolated``): the arguments are the
    whole configuration. The output errors are predicted whatever rules are selected.
    """

    if probe is not None and probe not in PROBE_DEVICES:
        raise UserError(f"probe must be None or one of {', '.join(PROBE_DEVICES)}, not {probe!r}")
    if isinstance(precisions, str):
        precisions = tuple(p.strip() for p in precisions.split(",") if p.strip())
    config = Config(select=list(select) if select is not None else None, ignore=list(ignore),
                    precisions=tuple(precisions), rtol=rtol, atol=atol, timeout=timeout, output_format="json")
    config.validate("preclint.check")
    if train and not isinstance(train, TrainingStep) and (train is not True or not isinstance(model, str)):
        raise UserError("train must be True for a model file, or preclint.training_step(...) for a model already built")
    options = CheckOptions(modes=tuple(precisions), rtol=rtol, atol=atol, predict_errors=True, train=bool(train))
    probe_options = _probe_options(probe)
    planning = PlanOptions(device=probe or "auto") if plan else None
    with preserved():
        session = Session(config, load=LoadOptions(train=train is True), check=options, probe=probe_options,
                          plan=planning, training=train if isinstance(train, TrainingStep) else None)
        with session:
            document = session.check(model, inputs)
            made = session.plan(model, inputs)[1] if plan else None
        environment = None
        if document.environment is None:
            from preclint.probe.device import check_environment  # lazy: the plain check loads no probe/measure/plan

            environment = check_environment()
    if document is None:  # a rank that only measures: the API runs in one process
        raise UserError("preclint.check runs in one process; under torchrun use the command line")
    return Report(document, made, environment)


def _probe_options(device: Optional[str]):
    if device is None:
        return None
    from preclint.probe import ProbeOptions  # lazy: the plain check loads no probe/measure/plan

    return ProbeOptions(device=device, ledger=True)
