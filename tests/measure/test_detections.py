"""Detections against a reference: a box another candidate replaced is a decision, counted among the
flips and not as rounding error; a box under a pixel wide that rounding shifts has not moved."""
import pytest
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


def _masked(boxes, masks, keypoints=None):
    found = _set(boxes, [0.9] * len(boxes))
    found[0]["masks"] = torch.stack(masks)[:, None]
    if keypoints is not None:
        found[0]["keypoints"] = torch.tensor(keypoints)
        found[0]["keypoints_scores"] = torch.ones(len(boxes), len(keypoints[0]))
    return found


def _square(x0, x1, value=0.8, size=16):
    mask = torch.zeros(size, size)
    mask[x0:x1, x0:x1] = value
    return mask


def test_masks_of_kept_detections_are_compared_by_their_values_and_their_binarized_iou():
    boxes = [[0.0, 0.0, 8.0, 8.0], [8.0, 8.0, 16.0, 16.0]]
    reference = _masked(boxes, [_square(0, 8), _square(8, 16)])
    # the first mask rounded (its pixels 1e-4 off), the second pasted into the same box, half of it
    # below the 0.5 a test binarizes at
    second = _square(8, 16)
    second[8:12, 8:16] = 0.3
    run = _masked(boxes, [_square(0, 8, 0.8001), second])
    comparison = compare_detections(run, reference)
    changes = comparison.changes
    assert (changes.kept, changes.masks, changes.masks_changed) == (2, 2, 1)
    assert abs(changes.mask_iou_min - 0.5) < 1e-9
    error, values = comparison.by_tensor[id(run[0]["masks"])]
    assert error.shape == (2, 1, 16, 16) and float(error.abs().max()) == 0.5  # 0.8 - 0.3: the values' own error
    assert "1 of 2 changed shape" in changes.describe()


def test_a_mask_pasted_into_a_box_rounded_otherwise_is_a_decision_not_numeric_error():
    boxes = [[0.0, 0.0, 8.0, 8.0]]
    reference = _masked(boxes, [_square(0, 8)])
    run = _masked(boxes, [_square(0, 9, 0.79)])  # its box rounded one pixel wider: resampled everywhere
    comparison = compare_detections(run, reference)
    assert comparison.changes.masks_repasted == 1
    assert id(run[0]["masks"]) not in comparison.by_tensor  # no values left to give a numeric error


def test_keypoints_that_jump_to_another_heatmap_cell_are_counted_apart_from_their_error():
    boxes = [[0.0, 0.0, 8.0, 8.0]]
    reference = _masked(boxes, [_square(0, 8)], [[[1.0, 1.0, 1.0], [4.0, 4.0, 1.0], [6.0, 2.0, 1.0]]])
    run = _masked(boxes, [_square(0, 8)], [[[1.001, 1.0, 1.0], [4.0, 4.0, 1.0], [6.0, 5.0, 1.0]]])
    comparison = compare_detections(run, reference)
    changes = comparison.changes
    assert (changes.keypoints, changes.keypoints_moved) == (3, 1) and changes.keypoint_max_shift == 3.0
    error, _ = comparison.by_tensor[id(run[0]["keypoints"])]
    assert error.shape == (2, 3) and float(error.abs().max()) < 0.01  # the jumped keypoint left out
    assert changes.as_dict()["keypoints_moved"] == 1
    assert "1 of 3 moved to another heatmap cell" in changes.describe()


@pytest.mark.slow
def test_the_probe_reports_each_detection_output_by_its_matched_values():
    # boxes and scores each get their own measured figure, at their place among the outputs (they were
    # pooled into one figure, and the report's per-output rows read n/a)
    from preclint.probe import ProbeOptions, measure_model
    from tests.helpers import check
    from tests.models.box_detector import BoxDetector

    torch.manual_seed(0)
    model, inputs = BoxDetector().eval(), ([torch.rand(3, 32, 32)],)
    _report, graph, ctx = check(model, inputs, precisions=("bf16",))
    measure = measure_model(model, inputs, graph, ("bf16",), ProbeOptions(device="cpu")).modes["bf16"]
    assert measure.detections.kept > 0
    boxes, scores = measure.outputs  # the labels are integers: decisions, not figures
    assert boxes is not None and scores is not None
    assert boxes.max_abs_error == measure.detections.box_max_abs_error
    assert scores.max_abs_error == measure.detections.score_max_abs_error
    assert 0 < scores.rel_error < 0.1 and 0 < boxes.rel_error < 0.1
    # and predicted apart, each within 3x of its own: the scores' error is the softmax's, not the boxes'
    # (both are gathered by the same top-k and NMS indices, which passed the larger error of the two to
    # each); the boxes' is their bfloat16 rounding, the anchors being made in the head's dtype
    # (``.to(like.dtype)``), which a float32 cast predicted 5x and more under
    from preclint.predict.outputs import output_figures

    predicted_boxes, predicted_scores = output_figures(graph, ctx.predictions["bf16"], graph.output_paths)
    assert abs(predicted_scores.rel_error - predicted_boxes.rel_error) > 0.5 * predicted_scores.rel_error
    assert 1 / 3 < predicted_scores.rel_error / scores.rel_error < 3
    assert 1 / 3 < predicted_boxes.rel_error / boxes.rel_error < 3
