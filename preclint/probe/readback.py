"""A mode's figures: issued on the device after its sweep (``queue_figures``), read back into its
ModeMeasure after every mode has been issued (``finish``)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple, Union

import torch

from preclint.core.findings import ErrorFigure
from preclint.core.ir import DOT_PRODUCT_KINDS
from preclint.core.notes import Note
from preclint.core.numerics import C_INPUT, MODES
from preclint.predict.accumulation import terms_rms
from preclint.load.modelio import output_tensors
from preclint.measure.compare import OutputDifferences, Tolerance, integer_pairs
from preclint.measure.detections import DetectionComparison, compare_detections
from preclint.measure.execute import tensors
from preclint.probe.ledger import ModeMeasure, NodeMeasure, ToleranceCheck
from preclint.probe.reference_pass import ReferenceStore
from preclint.probe.scalars import Scalars
from preclint.probe.sweep import NodeSlots, Swept


# A conv or matmul ran in TF32 when its local error is nearer (on a log scale) to TF32's size
# C_INPUT * 2^-11 * RMS(sqrt(sum (a b)^2)) than to float32's C_INPUT * 2^-24 * ...: the geometric
# midpoint is 2^-17.5, a factor of 90 from each size: a kernel's error strays from its format's size
# (longer sums, cancellation) by far less than that, so the two do not meet at the threshold.
TF32_THRESHOLD = 2.0 ** -17.5


@dataclass
class Pending:
    """A mode's figures issued on the device and not yet read back: where each sits in the sweep's
    Scalars (``queue_figures`` fills it, ``finish`` reads it)."""

    swept: Swept
    outputs: OutputDifferences
    tolerance: Tolerance  # what the outputs are checked against
    ablate: bool  # the ablation runs after the read-back, on the sweep's error vectors
    contribution_slots: Dict[str, int] = field(default_factory=dict)
    norm_slot: Optional[int] = None  # ||E|| the contributions are divided by
    out_slots: List[Tuple[Tuple[int, int], int]] = field(default_factory=list)  # ((||e||_2, ||e||_inf), ||ref||_2)
    output_slots: List[Optional[int]] = field(default_factory=list)  # each float output: its index in out_slots
    tol_slots: Optional[Tuple[int, int, int, int]] = None  # (failing, elements, smallest atol, smallest rtol)
    flip_slots: List[Tuple[int, int]] = field(default_factory=list)  # (changed elements slot, elements)
    delta: Union[None, float, List[Tuple[int, bool]]] = None  # the plain run against the observed one: inf, or [(slot, is_label)]
    detections: Optional[DetectionComparison] = None  # the output's detection sets against the reference's


def matched_in_place(output: Any, outputs: OutputDifferences, detections: DetectionComparison):
    """The output differences with each detection tensor's matched error (and reference values) at its
    place among the float outputs; matched values whose tensor is not found there follow at the end."""
    errors, references = list(outputs.errors), list(outputs.references)
    placed = set()
    floats = [t for t in output_tensors(output) if t.is_floating_point()]
    for position, t in enumerate(floats[:len(errors)]):
        found = detections.by_tensor.get(id(t))
        if found is not None and errors[position] is None:
            errors[position], references[position] = found
            placed.add(id(t))
    for key, (error, values) in detections.by_tensor.items():
        if key not in placed:
            errors.append(error)
            references.append(values)
    return errors, references


def _output_figure(scalars, slots) -> ErrorFigure:
    (e2, einf), r2 = slots
    err, ref, max_abs = scalars[e2], scalars[r2], scalars[einf]
    if not (_finite(err) and _finite(max_abs)):
        return ErrorFigure(float("inf"), float("inf"))
    return ErrorFigure(err / ref if ref > 0 else 0.0, max_abs)


def queue_figures(swept: Swept, contributions: Tuple[List[str], Optional[torch.Tensor]], outputs: OutputDifferences,
                  tolerance: Tolerance, plain: Any = None, ablate: bool = False) -> Pending:
    """Issue the work of the sweep's figures on the device, without waiting for it (``finish`` reads
    them); ``plain``: the output of the plain run, compared with the observed one."""
    obs = swept.observer
    scalars = obs.scalars
    pending = Pending(swept, outputs, tolerance, ablate)
    errors, ref_outputs = outputs.errors, outputs.references
    names, values = contributions
    if names:
        first = scalars.add_vector(values)
        pending.contribution_slots = {name: first + i for i, name in enumerate(names)}
        pending.norm_slot = scalars.add(torch.sqrt(sum(torch.sum(e.double() * e.double()) for e in outputs.present())))
    # detection sets: their matched boxes, scores, masks and keypoints count as output values, each at
    # its own output's place (measure/detections.py)
    pending.detections = compare_detections(swept.output, obs.first.output)
    if pending.detections is not None:
        errors, ref_outputs = matched_in_place(swept.output, outputs, pending.detections)
    for i, (e, r) in enumerate(zip(errors, ref_outputs)):
        if i < len(outputs.errors):
            pending.output_slots.append(len(pending.out_slots) if e is not None else None)
        if e is None:
            continue
        pending.out_slots.append((scalars.norms(e), scalars.norms(r)[0]))
    if tolerance.compares_values and pending.out_slots:
        pending.tol_slots = _tolerance_slots(errors, ref_outputs, tolerance, scalars)
    for o, r in integer_pairs(swept.output, obs.first.output):
        changed = (o.to(r.device) != r) if o.shape == r.shape else torch.ones(max(o.numel(), r.numel()), dtype=torch.bool, device=r.device)
        pending.flip_slots.append((scalars.add(changed.sum()), changed.numel()))
    if plain is not None:
        pending.delta = _difference_slots(plain, swept.output, scalars)
    scalars.compute()
    return pending


def _difference_slots(plain: Any, observed: Any, scalars: Scalars):
    """Largest |plain - observed| per output, as slots (inf at once when they differ in shape)."""
    a, b = tensors(plain), tensors(observed)
    if len(a) != len(b):
        return math.inf
    slots = []
    for x, y in zip(a, b):
        if x.shape != y.shape:
            return math.inf
        if x.is_floating_point():
            if not x.numel():
                continue
            both_nan = x.isnan() & y.isnan()
            d = (x.double() - y.double()).abs().masked_fill(both_nan, 0.0)
            d = d.masked_fill(x == y, 0.0)  # equal infinities
            slots.append((scalars.add(d.max()), False))
        else:
            slots.append((scalars.add((x != y).any()), True))
    return slots


def observer_delta(pending: Pending) -> Optional[float]:
    """Largest |plain - observed| over the outputs (inf when they differ in shape or labels)."""
    if pending.delta is None or isinstance(pending.delta, float):
        return pending.delta
    scalars = pending.swept.observer.scalars
    worst = 0.0
    for slot, label in pending.delta:
        if label:
            if scalars[slot]:
                return math.inf
        else:
            worst = max(worst, scalars[slot])
    return worst


def finish(measure: ModeMeasure, pending: Pending, ref: ReferenceStore, graph) -> None:
    """Read the sweep's figures back and fill ``measure``."""
    swept = pending.swept
    obs = swept.observer
    scalars = obs.scalars
    contribution_slots, norm_slot = pending.contribution_slots, pending.norm_slot
    out_slots, tol_slots, flip_slots, tolerance = pending.out_slots, pending.tol_slots, pending.flip_slots, pending.tolerance
    contributions = bool(contribution_slots)
    scalars.resolve()
    measure.observer_delta = observer_delta(pending)

    # the output
    if out_slots:
        sq_err = sum(scalars[s[0][0]] ** 2 for s in out_slots)
        sq_ref = sum(scalars[s[1]] ** 2 for s in out_slots)
        max_abs = max(scalars[s[0][1]] for s in out_slots)
        finite = _finite(sq_err) and _finite(max_abs)
        rel = (sq_err ** 0.5 / sq_ref ** 0.5 if sq_ref > 0 else 0.0) if finite else float("inf")
        measure.output = ErrorFigure(rel, max_abs if finite else float("inf"))
        measure.output_finite = finite
        if len(pending.output_slots) > 1:  # several outputs: each one's figure too, relative to its own values
            measure.outputs = [_output_figure(scalars, out_slots[k]) if k is not None else None
                               for k in pending.output_slots]
    if flip_slots:
        measure.output_flips = int(sum(scalars[s] for s, _ in flip_slots))
        measure.output_units = int(sum(n for _, n in flip_slots))
        if measure.output_finite is None:
            measure.output_finite = True
    if pending.detections is not None:
        changes = measure.detections = pending.detections.changes
        measure.output_flips = (measure.output_flips or 0) + changes.changed
        measure.output_units = (measure.output_units or 0) + changes.units
        if measure.output_finite is None:
            measure.output_finite = True
        if not contributions:
            measure.notes.append(Note("probe", "contributions not measured: a detector's boxes are compared by "
                                               "matching, not element by element"))
    if tol_slots is not None:
        rtol, atol = tolerance.bounds()
        failing, numel, min_atol, min_rtol = tol_slots
        measure.tolerance = ToleranceCheck(rtol, atol, int(scalars[failing]), numel, scalars[min_atol],
                                           scalars[min_rtol] if _finite(scalars[min_rtol]) else None)

    # every node
    contributions_valid = contributions and _finite(scalars[norm_slot]) and scalars[norm_slot] > 0
    if contributions and not contributions_valid:
        measure.notes.append(Note("probe", "contributions not measured: the output error is zero or not finite"))
    explained = 0.0
    any_contribution = False
    received_rel: Dict[Tuple[str, int], Tuple[float, float]] = {}  # (squared error norm, squared ref norm)
    for name in ref.order:
        slots = obs.slots.get(name)
        if slots is None:
            continue
        m = NodeMeasure(dtype=slots.dtype, note=slots.note)
        sq_e = sq_r = 0.0
        max_abs = 0.0
        for j, n2, ninf in slots.received:
            r = ref.norm(name, j) or 0.0
            received_rel[(name, j)] = (scalars[n2] ** 2, r * r)
            sq_e += scalars[n2] ** 2
            sq_r += r * r
            max_abs = max(max_abs, scalars[ninf])
        if slots.received:
            finite = _finite(sq_e) and _finite(max_abs)
            m.received = ErrorFigure((sq_e ** 0.5 / sq_r ** 0.5 if sq_r > 0 else 0.0) if finite else float("inf"),
                                max_abs if finite else float("inf"))
            m.nonfinite = not finite  # the same inf as the reference's counts as no error (difference())
            if m.nonfinite and measure.first_nonfinite is None:
                measure.first_nonfinite = name
        if slots.local_zero:
            m.local = ErrorFigure(0.0, 0.0)
        elif slots.local:
            sq_l = sum(scalars[n2] ** 2 for _, n2, _ in slots.local)
            sq_lr = sum((ref.norm(name, j) or 0.0) ** 2 for j, _, _ in slots.local)
            max_l = max(scalars[ninf] for _, _, ninf in slots.local)
            finite = _finite(sq_l) and _finite(max_l)
            m.local = ErrorFigure((sq_l ** 0.5 / sq_lr ** 0.5 if sq_lr > 0 else 0.0) if finite else float("inf"),
                             max_l if finite else float("inf"))
        if slots.flips:
            m.flips = int(sum(scalars[f] for f, _ in slots.flips))
            m.units = int(sum(scalars[u] for _, u in slots.flips))
        m.amplification = _amplification(m, slots, received_rel)
        if name in contribution_slots and contributions_valid:
            value = scalars[contribution_slots[name]]
            if _finite(value):
                m.contribution = value
                explained += value
                any_contribution = True
        node = graph.get(name)
        if (MODES[measure.mode].kernel_choice_matters and node is not None and node.kind in DOT_PRODUCT_KINDS
                and m.local is not None):
            numel = node.out.numel if node.out is not None and node.out.numel else None
            if numel:
                m.local_rms = (sum(scalars[n2] ** 2 for _, n2, _ in slots.local) / numel) ** 0.5
            m.tf32_applied = tf32_applied(node, m)
        measure.nodes[name] = m
    if any_contribution:
        measure.explained = explained
    measure.diverged_at = obs.diverged_at
    measure.reordered = [name for name in obs.slots if name in obs.reordered]


def _amplification(m: NodeMeasure, slots: NodeSlots, received: Dict[Tuple[str, int], Tuple[float, float]]) -> Optional[float]:
    if m.received is None or m.local is None or slots.local_from_received:
        return None
    sq_e = sum(received[s][0] for s in slots.inputs if s in received)
    sq_r = sum(received[s][1] for s in slots.inputs if s in received)
    if sq_r <= 0 or sq_e <= 0 or not _finite(sq_e) or not _finite(m.received.rel_error):
        return None
    incoming = (sq_e / sq_r) ** 0.5
    if incoming == 0.0:  # the operands' norm overflows (a finfo.min mask in a float32 reference): no ratio
        return None
    passed_on = max(m.received.rel_error ** 2 - (m.local.rel_error or 0.0) ** 2, 0.0) ** 0.5
    return passed_on / incoming


def tf32_applied(node, m: NodeMeasure) -> Optional[bool]:
    """TF32-sized local error (True) or float32-sized (False), against the size of the summed terms
    the check recorded for ``node`` (None without them: a rank that measured without the check's
    statistics leaves it to rank 0, distributed.py)."""
    if m.local is None or m.local.rel_error is None or not _finite(m.local.rel_error) or m.local_rms is None:
        return None
    terms = terms_rms(node) or (node.out.rms if node.out is not None else None)
    if not terms:
        return None
    return m.local_rms / (C_INPUT * terms) > TF32_THRESHOLD


def _tolerance_slots(errors, refs, tolerance, scalars: Scalars):
    """Elements failing |d| <= atol + rtol |ref|, and the smallest atol (at rtol) and rtol (at atol) that pass."""
    rtol, atol = tolerance.bounds()
    failing = None
    min_atol = None
    min_rtol = None
    numel = 0
    for e, r in zip(errors, refs):
        if e is None or e.numel() == 0:
            continue
        d = e.abs()
        a = r.abs()
        numel += d.numel()
        fail = (d > atol + rtol * a) | ~torch.isfinite(d)
        need_atol = (d - rtol * a).clamp_min(0).max()
        # where |ref| == 0 no rtol helps an element beyond atol: its need is inf
        over = (d - atol).clamp_min(0)
        need_rtol = torch.where(over > 0, over / a, torch.zeros_like(over)).max()
        failing = fail.sum() if failing is None else failing + fail.sum()
        min_atol = need_atol if min_atol is None else torch.maximum(min_atol, need_atol)
        min_rtol = need_rtol if min_rtol is None else torch.maximum(min_rtol, need_rtol)
    if failing is None:
        return None
    return scalars.add(failing), numel, scalars.add(min_atol), scalars.add(min_rtol)


def _finite(value) -> bool:
    return value is not None and value == value and value not in (float("inf"), float("-inf"))
