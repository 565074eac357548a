"""NMS margins by consequence: a swap in score order counts where it changes which boxes NMS keeps by
position, as the probe judges an NMS (measure/detections.changed_decisions), not where the other of
two overlapping boxes is kept in the same place."""
import pytest
import torch
import torchvision
from torch import nn

from preclint.measure.detections import MATCH_IOU, changed_decisions
from preclint.measure.runners import run_reference
from preclint.reference.analyses._nms_swaps import SAME_BOX_IOU
from preclint.reference.analyses.margins import DecisionMargins, nms_margins
from tests.helpers import check


def test_the_analysis_judges_boxes_by_position_as_the_probe_does():
    assert SAME_BOX_IOU == MATCH_IOU


def test_a_swap_that_keeps_the_other_box_in_the_same_place_changes_nothing():
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.5, 0.0, 10.5, 10.0], [50.0, 50.0, 60.0, 60.0],
                          [50.0, 50.0, 60.0, 60.0]])
    scores = torch.tensor([0.9, 0.8999, 0.5, 0.5])
    # the first two overlap (IoU 0.9): either one kept is the same detection; the last two are one
    # box computed alike
    assert torch.isinf(nms_margins("nms", (boxes, scores, 0.5), {})).all()


def test_a_swap_whose_winner_suppresses_otherwise_changes_the_boxes_it_reaches():
    # A > B > C along a row: A and B overlap beyond 0.3, B and C too, A and C do not. NMS keeps A and
    # C; with A and B swapped it keeps B alone, which is neither A's place nor C's.
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [4.0, 0.0, 14.0, 10.0], [8.0, 0.0, 18.0, 10.0]])
    scores = torch.tensor([0.9, 0.8999, 0.5])
    margins = nms_margins("nms", (boxes, scores, 0.3), {})
    assert torch.allclose(margins, torch.full((3,), 1e-4, dtype=torch.float64), rtol=1e-3)
    # of another class, B suppresses neither
    classes = torch.tensor([0, 1, 0])
    assert torch.isinf(nms_margins("batched_nms", (boxes, scores, classes, 0.3), {})).all()


class NearTiedNms(nn.Module):
    """Scores in a band a few float32 roundings wide (1 plus a small spread: float32 resolves 1.2e-7
    there) over a row of boxes that overlap their neighbours: NMS's order swaps at float32's level."""

    def __init__(self, spread: float):
        super().__init__()
        self.score = nn.Linear(16, 1)
        self.spread = spread

    def forward(self, features, left):
        scores = self.score(features)[:, 0] * self.spread + 1.0
        boxes = torch.stack([left, torch.zeros_like(left), left + 10.0, torch.full_like(left, 10.0)], dim=-1)
        return boxes, torchvision.ops.nms(boxes, scores, 0.5)


def _predicted_and_measured(spread: float, seeds: int = 4, n: int = 512):
    """fp32's predicted NMS flips against float64, and those float32 makes on the CPU, over ``seeds`` models."""
    predicted = measured = 0.0
    for seed in range(seeds):
        torch.manual_seed(seed)
        model = NearTiedNms(spread).eval()
        inputs = (torch.randn(n, 16), torch.rand(n) * n * 2.0)
        _report, graph, ctx = check(model, inputs, precisions=("fp32",))
        (node,) = [x for x in graph.nodes if x.fn == "nms"]
        predicted += ctx.predictions["fp32"].nodes[node.name].flip_fraction * node.record(DecisionMargins).units
        with torch.no_grad():
            boxes32, kept32 = model(*inputs)
            boxes64, kept64 = run_reference(model, inputs)
        measured += changed_decisions(kept32, kept64, boxes32, boxes64)[0]
    return predicted, measured


@pytest.mark.slow
def test_fp32_predicts_the_nms_flips_float32_makes_against_float64():
    # Counting every overlapping pair's swap predicted 60 flips here, where float32 made 2.
    predicted, measured = _predicted_and_measured(1e-6)
    assert measured > 0
    assert measured / 3 <= predicted <= measured * 3


@pytest.mark.slow
def test_fp32_predicts_no_nms_flip_where_the_scores_stand_apart():
    predicted, measured = _predicted_and_measured(1e-3, seeds=2)
    assert measured == 0 and predicted < 0.05
