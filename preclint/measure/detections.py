"""Detections measured against the float64 reference: which boxes a precision keeps, loses, adds or moves.

A detector's output is a set per image (torchvision: ``{"boxes": (N, 4), "scores": (N,), "labels":
(N,)}``) whose order and length follow from top-k, score thresholds and NMS. Elementwise comparison
means nothing there: one box more shifts every later row. The probe matches the detections of a
precision's run to the reference's instead, greedily by IoU (pairs of the same label first), and counts:

* ``kept``: matched, same label, IoU >= KEPT_IOU or every corner within MOVED_PIXELS: the box is
  where it was;
* ``moved``: matched, same label, MATCH_IOU <= IoU < KEPT_IOU, a corner more than MOVED_PIXELS away:
  the same object, another box;
* ``relabelled``: matched by IoU to a detection of another label only;
* ``lost`` / ``added``: detections of the reference / of the run without a match.

Scores and boxes of the kept pairs give the numeric error; the changed detections (all but the kept)
over all detections (kept plus changed) are the fraction of the output's decisions that flipped. A
moved box is another candidate that won (another NMS winner, a top-k that chose otherwise): its
offset is a decision's, tens of pixels, and counted among the flips rather than as rounding error
(counted as error, it made a random-init Faster R-CNN's TF32 error 5 times the prediction: issue 26;
benchmarks/float32_floor.py tf32 measures it over the kept detections).

Every float tensor of a set with one row per detection (masks, keypoints, keypoint scores beside the
boxes and scores) is compared over the kept pairs too, each as an output of its own: a mask by its
values and by its binarized IoU with the reference's; a keypoint by how far it moved, where one that
moved by more than MOVED_PIXELS is another heatmap cell its argmax chose (a decision, counted apart,
as a moved box is) and the others give the numeric error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch

# IoU at which two detections are the same one (COCO's criterion for a true positive).
MATCH_IOU = 0.5
# A box whose IoU with its reference is below this has visibly moved: rounding alone moves a box by a
# fraction of a pixel (IoU > 0.99 for boxes of ten pixels and more), a different NMS winner moves it
# by a good part of its size.
KEPT_IOU = 0.9
# A box whose corners all lie this close to the reference's has not moved, whatever its IoU: a box
# under a pixel wide (random-init detectors clip many to the image's border) loses IoU to rounding.
MOVED_PIXELS = 0.5
# Where a mask probability becomes a pixel of the object (torchvision's and COCO's evaluation).
MASK_THRESHOLD = 0.5


@dataclass
class DetectionChanges:
    reference: int = 0  # detections in the reference run
    measured: int = 0  # detections in this precision's run
    kept: int = 0
    moved: int = 0
    relabelled: int = 0
    lost: int = 0
    added: int = 0
    score_max_abs_error: Optional[float] = None  # over kept pairs
    box_max_abs_error: Optional[float] = None  # pixels, over kept pairs
    sets: int = 0  # detection sets compared (images)
    # masks and keypoints of the kept detections (Mask R-CNN, Keypoint R-CNN), compared by matching too
    masks: int = 0
    masks_changed: int = 0  # binarized mask IoU below KEPT_IOU
    mask_iou_min: Optional[float] = None
    masks_repasted: int = 0  # pasted into a box that rounds to other pixels than the reference's
    keypoints: int = 0
    keypoints_moved: int = 0  # moved by more than MOVED_PIXELS: another heatmap cell won its argmax
    keypoint_max_shift: Optional[float] = None  # pixels

    @property
    def changed(self) -> int:
        return self.moved + self.relabelled + self.lost + self.added

    @property
    def units(self) -> int:
        return self.kept + self.changed

    @property
    def flip_fraction(self) -> Optional[float]:
        return self.changed / self.units if self.units else None

    def add(self, other: "DetectionChanges") -> None:
        for key in ("reference", "measured", "kept", "moved", "relabelled", "lost", "added", "sets", "masks",
                    "masks_changed", "masks_repasted", "keypoints", "keypoints_moved"):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        for key, pick in (("score_max_abs_error", max), ("box_max_abs_error", max), ("keypoint_max_shift", max),
                          ("mask_iou_min", min)):
            a, b = getattr(self, key), getattr(other, key)
            setattr(self, key, b if a is None else a if b is None else pick(a, b))

    def as_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {k: getattr(self, k) for k in ("reference", "measured", "kept", "moved", "relabelled",
                                                             "lost", "added")}
        out["flip_fraction"] = self.flip_fraction
        out["score_max_abs_error"] = self.score_max_abs_error
        out["box_max_abs_error"] = self.box_max_abs_error
        if self.masks:
            out.update(masks=self.masks, masks_changed=self.masks_changed, mask_iou_min=self.mask_iou_min,
                       masks_repasted=self.masks_repasted)
        if self.keypoints:
            out.update(keypoints=self.keypoints, keypoints_moved=self.keypoints_moved,
                       keypoint_max_shift=self.keypoint_max_shift)
        return out

    def describe(self) -> str:
        """One line for the report."""
        if not self.reference and not self.measured:
            return f"no detections in the reference or in this run ({self.sets} image(s))"
        parts = [f"{self.kept} of {self.reference} reference detections kept"]
        for key in ("moved", "relabelled", "lost", "added"):
            if getattr(self, key):
                parts.append(f"{getattr(self, key)} {key}")
        text = ", ".join(parts)
        errors = []
        if self.score_max_abs_error is not None:
            errors.append(f"scores by up to {self.score_max_abs_error:.3g}")
        if self.box_max_abs_error is not None:
            errors.append(f"kept boxes by up to {self.box_max_abs_error:.3g} px")
        text += f"; {' and '.join(errors)}" if errors else ""
        if self.masks:
            text += (f"; of their masks (> {MASK_THRESHOLD}) {self.masks_changed} of {self.masks} changed shape "
                     f"(IoU < {KEPT_IOU}), the least IoU {self.mask_iou_min:.3g}; {self.masks_repasted} pasted "
                     "into a box rounded to other pixels")
        if self.keypoints:
            text += (f"; of their keypoints {self.keypoints_moved} of {self.keypoints} moved to another heatmap "
                     f"cell (by up to {self.keypoint_max_shift:.3g} px)")
        return text


def is_detection_set(value) -> bool:
    boxes = value.get("boxes") if isinstance(value, dict) else None
    return (isinstance(boxes, torch.Tensor) and boxes.is_floating_point() and boxes.dim() == 2
            and boxes.shape[-1] == 4)


def detection_sets(output) -> List[Dict[str, torch.Tensor]]:
    """The detection sets in a model's output, in order (dicts with (N, 4) float "boxes")."""
    found: List[Dict[str, torch.Tensor]] = []

    def visit(value, depth: int) -> None:
        if is_detection_set(value):
            found.append(value)
        elif depth < 4 and isinstance(value, (list, tuple)):
            for v in value:
                visit(v, depth + 1)
        elif depth < 4 and isinstance(value, dict):
            for v in value.values():
                visit(v, depth + 1)

    visit(output, 0)
    return found


def detection_tensor_ids(output) -> set:
    """ids of the tensors inside detection sets: compared by matching, never position by position."""
    return {id(t) for s in detection_sets(output) for t in s.values() if isinstance(t, torch.Tensor)}


def box_iou(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """IoU of every box of ``a`` (N, 4, x1 y1 x2 y2) with every box of ``b`` (M, 4); degenerate boxes
    match only themselves."""
    a, b = a.double(), b.double()
    area_a = (a[:, 2] - a[:, 0]).clamp(min=0) * (a[:, 3] - a[:, 1]).clamp(min=0)
    area_b = (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    wh = (rb - lt).clamp(min=0)
    inter = wh[..., 0] * wh[..., 1]
    union = area_a[:, None] + area_b[None, :] - inter
    same = (a[:, None, :] == b[None, :, :]).all(-1).double()
    return torch.where(union > 0, inter / union.clamp(min=1e-300), same)


def match(boxes: torch.Tensor, reference: torch.Tensor, labels: Optional[torch.Tensor] = None,
          reference_labels: Optional[torch.Tensor] = None, threshold: float = MATCH_IOU) -> List[Tuple[int, int, float]]:
    """(index in ``boxes``, index in ``reference``, IoU) of greedily matched pairs at IoU >= threshold:
    pairs of the same label before pairs of different labels, and higher IoU first within each."""
    if not len(boxes) or not len(reference):
        return []
    iou = box_iou(boxes.detach().cpu(), reference.detach().cpu())
    rows, cols = torch.nonzero(iou >= threshold, as_tuple=True)
    if not len(rows):
        return []
    values = iou[rows, cols]
    same = torch.zeros_like(values)
    if labels is not None and reference_labels is not None:
        same = (labels.detach().cpu()[rows] == reference_labels.detach().cpu()[cols]).double()
    order = torch.argsort(same * 2.0 + values, descending=True)  # IoU <= 1: a label match outranks any IoU
    pairs, used_a, used_b = [], set(), set()
    for i, j, v in zip(rows[order].tolist(), cols[order].tolist(), values[order].tolist()):
        if i not in used_a and j not in used_b:
            used_a.add(i)
            used_b.add(j)
            pairs.append((i, j, v))
    return pairs


@dataclass
class DetectionComparison:
    """A run's detection sets against the reference's: the changes, and the matched values' errors,
    per tensor of the run's sets (``by_tensor``: id of the run's tensor -> (error, reference values);
    boxes, scores, masks, keypoints: whatever float tensor holds one row per detection)."""

    changes: DetectionChanges
    errors: List[torch.Tensor] = field(default_factory=list)  # matched values, run minus reference
    references: List[torch.Tensor] = field(default_factory=list)  # the reference values of those
    by_tensor: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)


def compare_detections(output, reference) -> Optional[DetectionComparison]:
    """Match the detection sets of ``output`` to those of ``reference`` (None: the output has none)."""
    runs, refs = detection_sets(output), detection_sets(reference)
    if not refs or len(runs) != len(refs):
        return None
    total = DetectionComparison(DetectionChanges())
    for run, ref in zip(runs, refs):
        changes, matched = _compare_set(run, ref)
        total.changes.add(changes)
        for key, (error, values) in matched.items():
            if not error.numel():  # nothing of it kept: no figure, rather than an error of 0
                continue
            total.errors.append(error)
            total.references.append(values)
            total.by_tensor[id(run[key])] = (error, values)
    return total


def _compare_set(run: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor]):
    boxes, ref_boxes = run["boxes"].detach(), ref["boxes"].detach()
    labels, ref_labels = run.get("labels"), ref.get("labels")
    if not (isinstance(labels, torch.Tensor) and isinstance(ref_labels, torch.Tensor)
            and len(labels) == len(boxes) and len(ref_labels) == len(ref_boxes)):
        labels = ref_labels = None
    pairs = match(boxes, ref_boxes, labels, ref_labels)
    changes = DetectionChanges(reference=len(ref_boxes), measured=len(boxes), sets=1)
    kept = []
    for i, j, iou in pairs:
        if labels is not None and int(labels[i]) != int(ref_labels[j]):
            changes.relabelled += 1
        elif iou >= KEPT_IOU or float((boxes[i].double() - ref_boxes[j].to(boxes.device).double()).abs().max()) <= MOVED_PIXELS:
            changes.kept += 1
            kept.append((i, j))
        else:
            changes.moved += 1
    changes.lost = len(ref_boxes) - len(pairs)
    changes.added = len(boxes) - len(pairs)
    matched: Dict[str, Tuple[torch.Tensor, torch.Tensor]] = {}
    if not kept:
        return changes, matched
    device = ref_boxes.device
    run_index = torch.tensor([i for i, _ in kept], device=boxes.device)
    ref_index = torch.tensor([j for _, j in kept], device=device)
    pairs_of = {key: (a.detach()[run_index].to(device).double(), b.detach()[ref_index].double())
                for key, a, b in per_detection_tensors(run, ref, len(boxes), len(ref_boxes))}
    moved_points = None
    if "keypoints" in pairs_of:
        moved_points = _compare_keypoints(changes, *pairs_of["keypoints"])
    if "masks" in pairs_of:
        _compare_masks(changes, *pairs_of["masks"])
    for key, (a, r) in pairs_of.items():
        e = a - r
        if moved_points is not None and key in ("keypoints", "keypoints_scores"):
            # a keypoint is a heatmap's argmax: one that jumped to another cell is a decision, counted
            # in keypoints_moved; the numeric error is the others'
            e, r = e[~moved_points], r[~moved_points]
        elif key == "masks":
            # a mask is resized to its box rounded to whole pixels and pasted there (torchvision's
            # paste_masks_in_image): where the two runs' boxes round to other pixels (a pixel inside one
            # paste and outside the other's, exactly 0 there), every pixel of the mask is resampled
            # otherwise; that rounding is a decision, counted in masks_repasted, and the numeric error
            # is the other masks'
            repasted = ((a == 0) != (r == 0)).flatten(1).any(dim=1)
            changes.masks_repasted += int(repasted.sum())
            e, r = e[~repasted], r[~repasted]
        matched[key] = (e, r)
        largest = float(e.abs().max()) if e.numel() else None
        if key in ("boxes", "scores"):
            setattr(changes, "box_max_abs_error" if key == "boxes" else "score_max_abs_error", largest)
    return changes, matched


def per_detection_tensors(run: Dict[str, torch.Tensor], ref: Dict[str, torch.Tensor], n: int, n_ref: int):
    """(key, run's tensor, reference's) of each float tensor holding one row per detection in both."""
    for key, a in run.items():
        b = ref.get(key)
        if (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.is_floating_point()
                and b.is_floating_point() and a.dim() >= 1 and len(a) == n and len(b) == n_ref
                and a.shape[1:] == b.shape[1:]):
            yield key, a, b


def _compare_keypoints(changes: DetectionChanges, run: torch.Tensor, ref: torch.Tensor) -> Optional[torch.Tensor]:
    """Keypoints (detections, K, 2 or 3: x, y[, visibility]) of the kept detections: how many moved by
    more than MOVED_PIXELS and how far; the moved ones as a (detections, K) mask."""
    if run.dim() != 3 or run.shape[-1] < 2:
        return None
    shift = (run[..., :2] - ref[..., :2]).norm(dim=-1)
    moved = shift > MOVED_PIXELS
    changes.keypoints += int(shift.numel())
    changes.keypoints_moved += int(moved.sum())
    if shift.numel():
        changes.keypoint_max_shift = max(changes.keypoint_max_shift or 0.0, float(shift.max()))
    return moved


def _compare_masks(changes: DetectionChanges, run: torch.Tensor, ref: torch.Tensor) -> None:
    """Masks (detections, ..., H, W) of the kept detections, as a test binarizes them (> MASK_THRESHOLD):
    each pair's IoU; a mask whose IoU is below KEPT_IOU has changed shape."""
    a = (run > MASK_THRESHOLD).flatten(1)
    b = (ref > MASK_THRESHOLD).flatten(1)
    inter = (a & b).sum(dim=1).double()
    union = (a | b).sum(dim=1).double()
    iou = torch.where(union > 0, inter / union.clamp(min=1), torch.ones_like(union))  # both empty: the same
    changes.masks += int(iou.numel())
    changes.masks_changed += int((iou < KEPT_IOU).sum())
    if iou.numel():
        changes.mask_iou_min = min(changes.mask_iou_min if changes.mask_iou_min is not None else 1.0,
                                   float(iou.min()))


def changed_decisions(kept: torch.Tensor, reference_kept: torch.Tensor, boxes: torch.Tensor,
                      reference_boxes: torch.Tensor, labels: Optional[torch.Tensor] = None,
                      reference_labels: Optional[torch.Tensor] = None) -> Tuple[int, int]:
    """(changed, units) of an NMS: the boxes it kept here against those it kept in the reference, by
    position (IoU >= MATCH_IOU, same label) rather than by index, since the candidates it chose from
    may differ in number and order between the runs. (Not KEPT_IOU: a low format rounds the boxes
    NMS compares, and the offsets of batched NMS's per-class trick make that coarse: bfloat16 holds
    coordinates near 300 to 2 pixels.)"""
    a = boxes.detach()[kept.long().to(boxes.device)]
    b = reference_boxes.detach()[reference_kept.long().to(reference_boxes.device)]
    la = labels.detach()[kept.long().to(labels.device)] if labels is not None else None
    lb = reference_labels.detach()[reference_kept.long().to(reference_labels.device)] if reference_labels is not None else None
    if la is None or lb is None:
        la = lb = None
    pairs = [p for p in match(a, b, la, lb)
             if la is None or int(la[p[0]]) == int(lb[p[1]])]
    units = len(a) + len(b) - len(pairs)
    return units - len(pairs), units
