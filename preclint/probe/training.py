"""The training step measured: each precision's step run on the probe's device (measure/training_step.py,
natively: CPU autocast and CPU kernels have float16 and bfloat16 on recent torch) and compared, parameter by
parameter, with the float64 step the prediction came from. The same figures as predict/training.py:

- ``underflow_fraction``: of the float64 gradient's nonzero elements, those the run's (unscaled) gradient has 0;
- ``grad_rel_error``: RMS(gradient - float64 gradient) / RMS(float64 gradient);
- ``lost_update_fraction``: of the weights the float64 step moves, those the run leaves bit for bit unchanged;
- ``nonfinite_updates``: weights the run makes inf or NaN.
"""
from __future__ import annotations

from typing import Dict, List

import torch

from preclint.core.errors import one_line
from preclint.core.notes import Note
from preclint.measure.training_step import StepRequest, run_step
from preclint.predict.ordinary import STEP_SHARE
from preclint.predict.training import ParameterFigures, TrainingFigures, totals
from preclint.training.statistics import nonfinite_count, relative_error, unchanged_fraction
from preclint.core.findings import ErrorFigure
from preclint.measure.trajectory import trajectories
from preclint.rules import all_rules


def probe_device(choice: str) -> torch.device:
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def measure_training(loaded, reference, modes, device: torch.device, notes: List[Note]) -> Dict[str, TrainingFigures]:
    """Each of ``modes``' step measured against ``reference`` (reference/training_step.py TrainingReference)."""
    request = StepRequest(loaded.module, loaded.inputs, loaded.training, device=device)
    measured = {}
    for mode in modes:
        try:
            run = run_step(request, mode)
        except RuntimeError as exc:  # a kernel the device lacks in that dtype
            notes.append(Note("training", f"the {mode} training step could not run on {device}: {one_line(exc)}"))
            continue
        measured[mode] = compare_step(run, reference)
    return measured


def compare_step(run, reference) -> TrainingFigures:
    """A run's step (measure/training_step.py StepRun) against the float64 one, per parameter."""
    rows = []
    grads, updates = {}, {}
    for name, truth in reference.step.parameters.items():
        ran = run.parameters[name]
        g64 = truth.grad if truth.grad is not None else torch.zeros_like(truth.before)
        grad = ran.grad if ran.grad is not None else torch.zeros_like(ran.before)
        nonzero = int(torch.count_nonzero(g64))
        under = int(((grad == 0) & (g64 != 0)).sum()) / nonzero if nonzero else 0.0
        update64 = truth.after - truth.before
        rows.append(ParameterFigures(name, reference.module_of[name], truth.before.numel(),
                                     relative_error(grad, g64) if nonzero else 0.0, under,
                                     unchanged_fraction(ran.before, ran.after, update64), nonfinite_count(ran.after)))
        grads[name], updates[name] = g64, update64
    return totals(run.mode, rows, grads, updates, loss_scale=run.scale, skipped_steps=run.skipped,
                  first_nonfinite_forward=run.first_nonfinite_forward,
                  first_nonfinite_backward=run.first_nonfinite_backward, scaled=run.scaled)


def measure_training_into(report, loaded, ctx, device_choice: str, steps: int = 0) -> None:
    """``--probe --train``: the measured figures beside the predicted ones in ``report.summary``; with
    ``steps``, each precision's trajectory over that many steps beside float32's (measure/trajectory.py)."""
    if ctx.training_reference is None:
        return
    notes: List[Note] = []
    measured = measure_training(loaded, ctx.training_reference, list(ctx.training), probe_device(device_choice), notes)
    for mode, figures in measured.items():
        report.summary[mode]["training"]["measured"] = figures.as_dict()
    judge_training(report.findings, measured, ctx.training)
    if steps:
        request = StepRequest(loaded.module, loaded.inputs, loaded.training, device=probe_device(device_choice))
        for mode, path in trajectories(request, list(measured), steps).items():
            report.summary[mode]["training"]["trajectory"] = path.as_dict()
    report.notes.extend(notes)


def judge_training(findings, measured: Dict[str, TrainingFigures], predicted: Dict[str, TrainingFigures]) -> None:
    """Confirm or refute each training-step finding by its rule's measured figure (Rule.training_figure):
    above the threshold (beyond float32's own lost updates for PCL602; any for a count) confirms it."""

    rules = all_rules()
    for finding in findings:
        key = getattr(rules.get(finding.code), "training_figure", None)
        if key is None:
            continue
        statuses = []
        for mode in finding.precisions:
            figures = measured.get(mode)
            if figures is None:
                continue
            value = getattr(figures, key)
            if key == "lost_update_fraction" and mode in predicted:  # beyond what float32 storage loses
                value -= predicted[mode].float32_lost_update_fraction or 0.0
            share = getattr(rules.get(finding.code), "training_share", None) or STEP_SHARE
            confirmed = value > 0 if key == "nonfinite_updates" else value > share
            figure = ErrorFigure(figures.grad_rel_error, None)
            figure.status = "confirmed" if confirmed else "refuted"
            finding.measured[mode] = figure
            statuses.append(figure.status)
        if statuses:
            finding.status = "confirmed" if "confirmed" in statuses else "refuted"

