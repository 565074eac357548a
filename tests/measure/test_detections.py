"""Detections against a reference: a box another candidate replaced is a decision, counted among the
flips and not as rounding error; a box under a pixel wide that rounding shifts has not moved."""
import torch

from preclint.measure.detections import compare_detections


def _set(boxes, scores):
    return [{"boxes": torch.tensor(boxes), "scores": torch.tensor(scores), "labels": torch.ones(len(scores), dtype=torch.long)}]


def test_a_box_another_candidate_replaced_is_a_flip_not_numeric_error():
    reference = _set([[0.0, 0.0, 100.0, 100.0], [200.0, 200.0, 240.0, 240.0]], [0.9, 0.8])
    # the first box rounded, the second replaced by an overlapping candidate 8 px away (IoU 0.67)
    run = _set([[0.0, 0.0, 100.0, 100.002], [208.0, 200.0, 248.0, 240.0]], [0.9000001, 0.79])
    comparison = compare_detections(run, reference)
    changes = comparison.changes
    assert (changes.kept, changes.moved) == (1, 1) and changes.flip_fraction == 0.5
    # the numeric error is the kept box's: the replaced one's 8 px are a decision's
    assert changes.box_max_abs_error < 0.01 and changes.score_max_abs_error < 1e-6
    assert max(float(e.abs().max()) for e in comparison.errors) < 0.01
    assert "kept boxes by up to 0.002 px" in changes.describe()


def test_a_box_under_a_pixel_wide_that_rounding_shifts_has_not_moved():
    # a random-init detector's box clipped to the border, 0.1 px wide: 0.02 px of rounding is IoU 0.67
    reference = _set([[319.9, 10.0, 320.0, 50.0]], [0.5])
    run = _set([[319.92, 10.0, 320.0, 50.0]], [0.5])
    changes = compare_detections(run, reference).changes
    assert (changes.kept, changes.moved) == (1, 0) and changes.flip_fraction == 0.0
