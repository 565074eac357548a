"""The error model for scaled GEMMs: predicted from the reference statistics, against the emulation."""
import pytest
import torch

from preclint.core.numerics import MODES, SCALED_MODES
from preclint.measure.runners import run_mode, run_reference
from preclint.predict.scaled import converted
from tests.helpers import check


class _Block(torch.nn.Module):
    def __init__(self, d: int = 64, head: int = 10) -> None:
        super().__init__()
        self.norm, self.up, self.down, self.head = (torch.nn.LayerNorm(d), torch.nn.Linear(d, 4 * d),
                                                    torch.nn.Linear(4 * d, d), torch.nn.Linear(d, head))

    def forward(self, x):
        x = x + self.down(torch.relu(self.up(self.norm(x))))
        return self.head(x)


@pytest.mark.slow
def test_predicted_output_error_is_the_emulated_one_within_1_5x():
    torch.manual_seed(0)
    model, x = _Block().eval(), torch.randn(2, 16, 64)
    report, graph, ctx = check(model, (x,), precisions=SCALED_MODES)
    reference = run_reference(model, (x,))
    for mode in SCALED_MODES:
        measured = float((run_mode(model, (x,), mode).double() - reference).norm() / reference.norm())
        predicted = ctx.predictions[mode].rel_error
        assert measured / 1.5 < predicted < measured * 1.5, (mode, predicted, measured)
        assert {n.module_path for n in graph.nodes if converted(n, MODES[mode])} == {"up", "down"}


@pytest.mark.slow
def test_layers_the_recipe_rejects_are_predicted_as_bf16():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(24, 40), torch.nn.ReLU(), torch.nn.Linear(40, 8))
    _, _, ctx = check(model, (torch.randn(4, 24),), precisions=("bf16", "fp8"))
    assert ctx.predictions["fp8"].rel_error == pytest.approx(ctx.predictions["bf16"].rel_error)


def test_masked_padding_rows_say_how_much_of_the_output_becomes_nan(tmp_path, capsys):
    # padded tokens zeroed by the mask upstream of a Linear, under fp8-rowwise with amax-epsilon = 0:
    # 6 of the 32 rows have amax 0, and the finding says what they do to the layer's output
    import json

    from preclint.cli import main

    path = tmp_path / "padded.py"
    path.write_text(
        "import torch\n"
        "from torch import nn\n\n\n"
        "class Encoder(nn.Module):\n"
        "    def __init__(self):\n"
        "        super().__init__()\n"
        "        self.embed = nn.Embedding(100, 32)\n"
        "        self.up = nn.Linear(32, 64)\n\n"
        "    def forward(self, ids, mask):\n"
        "        return self.up(self.embed(ids) * mask.unsqueeze(-1))\n\n\n"
        "torch.manual_seed(0)\n"
        "model = Encoder().eval()\n"
        "mask = torch.ones(2, 16)\n"
        "mask[1, 10:] = 0\n"
        "example_inputs = (torch.randint(0, 100, (2, 16)), mask)\n")
    main(["check", str(path), "--precision", "fp8-rowwise", "--scaling", "amax-epsilon=0", "--output-format", "json"])
    findings = json.loads(capsys.readouterr().out)["findings"]
    message = next(f["message"] for f in findings if f["code"] == "PCL106")
    assert "6 of the 32 rows of its input have amax 0" in message
    assert "NaN in 19% of the layer's output rows" in message
