"""``--reference-device``: float32 on the probe's device against float32 on another device, node by node.

A test that compares a model's outputs with expected outputs recorded on another device (torchvision's
``test_models.py`` records them on the CPU and runs on GPUs) compares two float32 runs whose kernels
add in other orders. No precision setting is involved, and none fixes what differs: the fp32 mode
predicts it, and this pass measures it. The float32 run on the reference device takes the place of
the float64 reference (a ReferenceStore kept on the probe's device); the probe's device then runs
the model in float32 (TF32 off) under the sweep's observer, so that every node gets its received
error against the other device, its local error (the node on the other device's inputs: the
kernels' own difference) and, for decisions, the units that went the other way there.

The outputs are compared three ways besides (measure/devices.py): here against there, and each
against float64 on its own device.
"""
from __future__ import annotations

import contextlib
from typing import List, Optional

import torch

from preclint.core.errors import one_line
from preclint.core.notes import Note
from preclint.probe.ledger import ModeMeasure
from preclint.capture.trees import map_tensors
from preclint.core.findings import percent, sci
from preclint.load.modelio import Inputs
from preclint.measure.backends import tf32
from preclint.measure.compare import output_differences
from preclint.measure.copies import copy_to
from preclint.measure.devices import across_devices, kernels_of, other_kernels, reference_device
from preclint.measure.modes import SharedCopies
from preclint.measure.runners import NativeRunner
from preclint.probe.device import is_out_of_memory
from preclint.probe.readback import finish, queue_figures
from preclint.probe.reference_pass import reference_pass, resolve_reference

# the mode whose float32 runs are compared: the one that judges float32 itself
FLOOR_MODE = "fp32"


def measure_across(session, result) -> None:
    """Fill ``result.cross_device`` (the outputs, measure/devices.py) and ``result.across`` (the
    nodes: a ModeMeasure of float32 here against float32 on the reference device)."""

    setting, copies = session.setting, session.copies
    target = reference_device(setting.options.reference_device)
    try:
        with session.clock("reference device"):
            result.cross_device = across_devices(copies.model32, copies.inputs32, setting.device, target)
            result.across = _sweep_across(session, target)
    except Exception as exc:  # the ledger stands without it
        if setting.device.type == "cuda":
            torch.cuda.empty_cache()
        reason = "out of memory" if is_out_of_memory(exc) else one_line(exc)
        session.notes.append(Note("device", f"float32 on {target} not compared with {setting.device}: {reason}"))
        return
    session.env["reference_device"] = result.cross_device.as_dict()


def _sweep_across(session, target: torch.device) -> Optional[ModeMeasure]:
    """The sweep of float32 on the probe's device against the float32 run on ``target``."""
    from preclint.probe.sweep import sweep  # lazy: looked up at each call, so that it can be replaced

    setting, copies = session.setting, session.copies
    device, program = setting.device, copies.program
    if copies.stream is not None:
        return None  # a streamed model's blocks live on the probe's device only
    same = target == device
    there = copies.model32 if same else copy_to(copies.model32, target)
    inputs = Inputs.of(copies.inputs32).map(lambda t: t.to(target))
    with tf32(False), (other_kernels(target) if same else contextlib.nullcontext()):
        store = reference_pass(program, there, inputs, keep_float64=False)
    resolve_reference(store)
    # the other device's values where the sweep compares them
    store.values = {name: [t.to(device) for t in values] for name, values in store.values.items()}
    store.output = _on(store.output, device)
    runner = NativeRunner(FLOOR_MODE, device)
    measure = ModeMeasure(FLOOR_MODE, f"float32 on {device} ({kernels_of(device, False)}) against float32 on "
                                      f"{target} ({kernels_of(target, same)})")
    run = runner.prepare(copies.model32, copies.inputs32, setting.graph, SharedCopies())
    swept = sweep(program, run, store, setting.graph, keep_errors=False)
    outputs = output_differences(swept.output, store.output)
    pending = queue_figures(swept, ([], None), outputs, setting.tolerance)
    finish(measure, pending, store, setting.graph)
    return measure


def _on(value, device: torch.device):
    return map_tensors(lambda t: t.to(device), value)


FLOOR_ADVICE = ("these decisions flip at float32's own level; no precision setting fixes that: compare with a "
                "tolerance on decisions (match detections, compare scores) or sort ties")


def across_notes(result, ctx) -> List[Note]:
    """The report's notes on float32 across devices: the outputs (here against there, each against
    float64) and each decision that went the other way on the other device, with what the fp32 mode
    predicts for it (``ctx``: the check's RuleContext, its predictions)."""

    cross, across = result.cross_device, result.across
    if cross is None:
        return []
    notes = [Note("device", f"probe: float32 across devices, {cross.kernels}: {cross.between.describe()}; against "
                            f"float64: {cross.device} {cross.device_vs_float64.describe()}; the reference "
                            f"({cross.reference_device}) {cross.reference_vs_float64.describe()}")]
    prediction = ctx.predictions.get(FLOOR_MODE) if ctx.predictions else None
    flipped = bool(cross.between.figure.flip_fraction)
    for name, m in (across.nodes.items() if across is not None else ()):
        if not m.units:
            continue
        predicted = prediction.nodes.get(name) if prediction is not None else None
        expected = (f"; {FLOOR_MODE} predicts {percent(predicted.disagreement)}"
                    if predicted is not None and predicted.disagreement is not None else "")
        node = ctx.graph.get(name)
        what = f" ({node.fn})" if node is not None else ""
        if m.flips or expected:
            notes.append(Note("device", f"probe: float32 on {cross.device} against {cross.reference_device}: "
                                        f"{ctx.display(name)}{what} decided {m.flips} of {m.units} the other way{expected}"))
        flipped = flipped or bool(m.flips)
    if across is not None and across.output is not None:
        notes.append(Note("device", f"probe: float32 on {cross.device} against {cross.reference_device}, node by node: "
                                    f"the output differs by {sci(across.output.rel_error)} relative RMS"
                                    + (f"; control flow parted at {ctx.display(across.diverged_at)}"
                                       if across.diverged_at else "")))
    if flipped:
        notes.append(Note("device", f"probe: {FLOOR_ADVICE} (TF32 off on both devices: this is no TF32 problem)"))
    return notes


def across_summary(result) -> dict:
    """Figures of float32 across devices for the fp32 mode's measured output in the summary."""
    cross = result.cross_device
    if cross is None:
        return {}
    between = cross.between.figure
    out = {"rel_error_across_devices": between.rel_error, "max_abs_error_across_devices": between.max_abs_error}
    if between.flip_fraction is not None:
        out["flip_fraction_across_devices"] = between.flip_fraction
    return out
