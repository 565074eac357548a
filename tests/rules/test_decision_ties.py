"""Decisions on exact ties (margin 0) are not precision flips; a measured flip figure never reads inf/NaN."""
import torch

from preclint.core.findings import ErrorFigure, Finding
from preclint.report.console import _figure_line
from tests.helpers import check


class TiedArgmax(torch.nn.Module):
    """Scores after a ReLU: rows where every unit is off tie at 0, the others are close calls."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(32, 8)

    def forward(self, x):
        return torch.relu(self.head(x)).argmax(dim=-1)


def _tied_model(offset: float):
    torch.manual_seed(0)
    model = TiedArgmax()
    with torch.no_grad():
        model.head.bias.fill_(offset)
    return model.eval()


def test_rows_that_tie_exactly_are_not_predicted_to_flip():
    # every row's scores are the bias, 64, exactly: "about 50% of its 64 decisions flip" before
    model = _tied_model(64.0)
    report, _, _ = check(model, (torch.zeros(64, 32),), precisions=("bf16",))
    assert not [f for f in report.findings if f.code == "PCL301"], [f.message for f in report.findings]


def test_ties_are_counted_apart_from_the_flips():
    model = _tied_model(0.0)
    torch.manual_seed(1)
    x = torch.randn(256, 32)
    x[:64] = 0  # zero rows: every score is the bias, 64, so their top two tie exactly
    with torch.no_grad():
        model.head.weight.mul_(1e-3)
        model.head.bias.add_(64.0)  # the other rows: close calls on a large offset, which bf16 cannot resolve
    report, _, _ = check(model, (x,), precisions=("bf16",))
    found = [f for f in report.findings if f.code == "PCL301"]
    assert found, [f.code for f in report.findings]
    assert "exact ties in float32" in found[0].message and "not counted as flips" in found[0].message
    assert "margins as small as 0 " not in found[0].message


def test_a_measured_flip_figure_without_an_error_shows_the_flips_only():
    f = Finding("PCL301", "decision-flip", "warning", "m", "fix",
                predicted={"tf32": ErrorFigure(1e-4, None, 0.5)},
                measured={"tf32": ErrorFigure(None, None, flip_fraction=0.03)})
    line = _figure_line(f)
    assert "inf/NaN" not in line and "measured flips 3.0%" in line
