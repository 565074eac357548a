"""Values on a format's grid round by far less than C_OUTPUT u: a detector's anchors are whole pixels,
and a box centre that a small regression moves off one rounds back by that offset, not by half the
spacing. Decoded in bfloat16, a random-init Faster R-CNN's boxes were predicted 6.6x over; the
rounding of such values is measured on the reference values (reference/analyses/exact_rounding.py)."""
import json

import pytest

from preclint.cli import main
from tests.predict.test_cast_to_dtype_of import DECODE

GRID_DECODER = """\
import torch
from torch import nn


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(16, 4)
        cells = torch.arange(256)
        centre = torch.stack([cells % 16, cells // 16], dim=1).float() * 8 + 4
        self.register_buffer("anchors", torch.cat([centre - 8, centre + 8], dim=1))

    def forward(self, x):
        deltas = self.head(x) * {scale}
{decode}"""


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["0.002", "0.5"])  # centres a hundredth of a pixel off the grid; spread over it
def test_boxes_on_the_pixel_grid_are_predicted_by_their_own_rounding(tmp_path, capsys, scale):
    path = tmp_path / "decoder.py"
    path.write_text(GRID_DECODER.format(scale=scale, decode=DECODE))
    code = main(["check", str(path), "--precision", "fp16,bf16", "--probe", "cpu", "--output-format", "json",
                 "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    for mode in ("fp16", "bf16"):
        entry = json.loads(out)["summary"][mode]
        predicted, measured = entry["predicted_output"]["rel_error"], entry["measured_output"]["rel_error"]
        assert measured / 3 <= predicted <= measured * 3, (mode, predicted, measured)
