"""The error an op receives where errors of one origin meet again: an iterative refinement that adds
each step's correction to coordinates detached from the step before (as RAFT does), measured by the
CPU-emulated probe. ``detach`` stops gradients, not errors, and the steps' corrections share their
errors' origin (the same features and context, rounded once), so the coordinates' error grows with
the steps rather than with their square root."""
import pytest
import torch
from torch import nn
import torch.nn.functional as F

from preclint.reference.analyses.received_gains import ReceivedGains
from preclint.predict.error_model import relative_errors
from preclint.probe import ProbeOptions, measure_model
from tests.helpers import check

# preclint's predictions hold within a factor of 3 on real models; here, on one class of model with
# nothing else going on, within 2 (measured 0.57-0.68 of predicted, bfloat16, seed 0)
FACTOR = 2.0


class Refinement(nn.Module):
    """Coordinates refined step by step from features sampled at them (grid_sample), each step
    adding a correction from a head that reads the sampled features, a context and the flow so far."""

    def __init__(self, steps: int = 12):
        super().__init__()
        self.steps = steps
        self.encoder = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
        self.context = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1))
        self.head = nn.Sequential(nn.Conv2d(34, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 2, 3, padding=1))

    def forward(self, image):
        features = self.encoder(image)
        context = self.context(image)
        n, _, h, w = features.shape
        ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32),
                                indexing="ij")
        coords0 = torch.stack((xs, ys)).expand(n, 2, h, w)
        scale = torch.tensor([2.0 / (w - 1), 2.0 / (h - 1)]).view(1, 2, 1, 1)
        coords = coords0
        for _ in range(self.steps):
            coords = coords.detach()
            sampled = F.grid_sample(features, (coords * scale - 1.0).permute(0, 2, 3, 1), align_corners=True)
            flow = coords - coords0  # the flow is small against the coordinates: an amplifier
            coords = coords + self.head(torch.cat((sampled, context, flow), dim=1))
        return coords - coords0


@pytest.fixture(scope="module")
def refinement():
    torch.manual_seed(0)
    model = Refinement().eval()
    inputs = (torch.rand(1, 3, 32, 32),)
    report, graph, ctx = check(model, inputs, precisions=("bf16",))
    result = measure_model(model, inputs, graph, ("bf16",), ProbeOptions(device="cpu"))
    return graph, ctx.predictions["bf16"], result.modes["bf16"]


def within(predicted, measured):
    return measured / FACTOR <= predicted <= measured * FACTOR


@pytest.mark.slow
def test_rounding_upstream_of_a_detach_reaches_the_output(refinement):
    _graph, prediction, measure = refinement
    assert within(prediction.rel_error, measure.output.rel_error), (prediction.rel_error, measure.output.rel_error)


@pytest.mark.slow
def test_the_coordinates_error_an_amplifier_receives_grows_with_the_steps(refinement):
    graph, prediction, measure = refinement
    amplifiers = [n for n in graph.nodes if n.record(ReceivedGains) is not None]
    assert len(amplifiers) >= 12  # each step's coords - coords0, and the last one
    for node in amplifiers:
        for name, received in prediction.nodes[node.name].inputs_received.items():
            measured = measure.nodes[name].received.rel_error
            assert within(received, measured), (node.name, name, received, measured)
    # the class of model the gains toward the input are for: op by op, each input's error taken as
    # independent, the last step's coordinates were predicted 3x too low (and falling with the steps)
    last = amplifiers[-1]
    coords = next(iter(prediction.nodes[last.name].inputs_received))
    op_by_op = relative_errors(graph, prediction)[coords]
    assert op_by_op < measure.nodes[coords].received.rel_error / FACTOR
