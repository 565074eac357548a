"""A model with several outputs (OpenCLIP: image features, text features, logit scale) gets one
predicted error per output, each relative to its own values, not one figure for all of them whose
relative error divides by the logit scale; and contributors that read alike are told apart."""
import json
import shutil

import pytest

import torch
from torch import nn

from preclint.cli import main
from preclint.report.summary import distinct_labels
from tests.helpers import check
from tests.paths import MODELS


def test_each_output_has_its_own_error_figure(capsys, tmp_path, monkeypatch):
    shutil.copy(MODELS / "two_towers.py", tmp_path / "model.py")
    monkeypatch.chdir(tmp_path)
    main(["check", "model.py", "--precision", "tf32,bf16", "--output-format", "json"])
    summary = json.loads(capsys.readouterr().out)["summary"]
    for mode in ("tf32", "bf16"):
        outputs = summary[mode]["outputs"]
        assert [o["output"] for o in outputs] == ["output[0]", "output[1]", "output[2]"]
        image, text, scale = (o["rel_error"] for o in outputs)
        merged = summary[mode]["predicted_output"]["rel_error"]
        # the features' error, relative to the features, is several times the figure pooled with the scale
        assert image > 3 * merged and text > 3 * merged
        assert scale == 0  # exp of a float32 parameter, outside any rounding matmul
    main(["check", "model.py", "--precision", "bf16"])
    table = capsys.readouterr().out
    assert "output[1]" in table and "layers contributing most (all outputs)" in table


def test_one_output_keeps_one_figure():
    report, _, _ = check(nn.Linear(8, 8), (torch.randn(2, 8),), precisions=("bf16",))
    assert "outputs" not in report.summary["bf16"]


class _TwoAdds(nn.Module):
    def forward(self, x):
        x = x + 0.3
        x = x + 0.7
        return x


def test_contributors_that_read_alike_are_told_apart():
    report, graph, ctx = check(_TwoAdds(), (torch.randn(64, 64) * 10,), precisions=("bf16-full",))
    adds = [n.name for n in graph.nodes if n.target == "operator.add"]
    labels = distinct_labels(ctx, adds)
    assert len(set(labels)) == 2 and all(label.startswith("operator.add in _TwoAdds (line ") for label in labels)
    shown = [t["module"] for t in report.summary["bf16-full"]["top_layers"]]
    assert len(shown) == len(set(shown))


@pytest.mark.slow
def test_the_probe_measures_each_output_as_the_check_predicts_it(capsys, tmp_path, monkeypatch):
    shutil.copy(MODELS / "two_towers.py", tmp_path / "model.py")
    monkeypatch.chdir(tmp_path)
    main(["check", "model.py", "--probe", "cpu", "--precision", "bf16", "--output-format", "json"])
    entry = json.loads(capsys.readouterr().out)["summary"]["bf16"]
    predicted = [o["rel_error"] for o in entry["outputs"]]
    measured = [o["rel_error"] for o in entry["measured_output"]["outputs"]]
    for p, m in zip(predicted[:2], measured[:2]):  # the features: within 3x, each against its own values
        assert m / 3 <= p <= 3 * m
    assert measured[2] < 1e-6  # the logit scale: float32's exp, no reduced-precision op


def test_the_tolerance_is_judged_on_each_output_at_its_own_scale():
    from tests.models.two_towers import TwoTowers

    model = TwoTowers().eval()
    torch.manual_seed(1)
    inputs = (torch.randn(4, 48), torch.randn(4, 24))
    report, _, _ = check(model, inputs, precisions=("bf16",), rtol=1e-2, atol=1e-5, select=["PCL001"])
    (finding,) = report.findings
    assert "output[0] " in finding.message and "output[2] 0)" in finding.message
    # the features' elements near zero fail: about a fifth (pooled with the scale of 14, it read 4%)
    fraction = float(finding.message.split("on about ")[1].split("%")[0])
    assert 10 < fraction < 30


def test_output_names_are_shortened_from_the_middle_and_never_read_alike():
    from preclint.report.console import output_labels

    names = ["output['logits_per_image']", "output['logits_per_text']",
             "output['text_model_output']['last_hidden_state']", "output['vision_model_output']['last_hidden_state']",
             "output['text_model_output']['pooler_output']", "output['vision_model_output']['pooler_output']",
             "output['x']['" + "a" * 50 + "1']", "output['x']['" + "a" * 50 + "2']"]
    labels = output_labels(names)
    assert len(set(labels.values())) == len(names)
    assert labels["output['logits_per_text']"] == "output['logits_per_text']"
    assert labels["output['vision_model_output']['last_hidden_state']"] == "output['vision…['last_hidden_state']"
    assert all(label.endswith("1']") or label.endswith("2']") for name, label in labels.items() if "aaa" in name)


class _SiglipLike(nn.Module):
    """Two logits outputs whose names share their first 21 characters, as SigLIP's do."""

    def __init__(self):
        super().__init__()
        self.image = nn.Linear(16, 16)
        self.text = nn.Linear(16, 16)

    def forward(self, x):
        image, text = self.image(x), self.text(x)
        return {"logits_per_image": image @ text.T, "logits_per_text": text @ image.T,
                "vision_model_output": {"last_hidden_state": image}, "text_model_output": {"last_hidden_state": text}}


def test_a_narrow_console_prints_names_that_tell_the_outputs_apart():
    from preclint.report.console import render

    report, _, _ = check(_SiglipLike(), (torch.randn(4, 16),), precisions=("bf16",))
    table = render(report, width=80)
    for label in ("output['logits_per_image']", "output['logits_per_text']",
                  "output['vision…['last_hidden_state']", "output['text_m…['last_hidden_state']"):
        assert label in table
