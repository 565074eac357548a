"""A mask filled with the lowest value of the dtype (Gemma2's ``torch.where(mask, x, finfo.min)``)
is the model's masking, not an error: the probe does not say "values first become inf/NaN at
torch.where" for it, while a real overflow is still said."""
import json
import shutil

import pytest
import torch

from preclint.cli import main
from preclint.probe.scalars import difference
from tests.paths import MODELS


def test_the_same_fill_in_both_runs_differs_by_nothing():
    reference = torch.tensor([float("-inf"), 1.0, torch.finfo(torch.float64).min], dtype=torch.float64)
    run = torch.tensor([torch.finfo(torch.float32).min, 1.5, float("-inf")], dtype=torch.float32)
    assert difference(run, reference, torch.float32, same_inf=True).tolist() == [0.0, 0.5, 0.0]


def test_a_real_overflow_still_differs_by_inf():
    reference = torch.tensor([7e4, float("-inf")], dtype=torch.float64)
    run = torch.tensor([float("inf"), 3.0], dtype=torch.float32)  # the second: a mask undone, not a fill
    d = difference(run, reference, torch.float32, same_inf=True)
    assert torch.isinf(d).all()


@pytest.mark.slow
def test_probe_of_a_gemma2_style_mask_says_nothing_of_inf(capsys, tmp_path, monkeypatch):
    shutil.copy(MODELS / "masked_attention.py", tmp_path / "model.py")
    monkeypatch.chdir(tmp_path)
    main(["check", "model.py", "--probe", "cpu", "--precision", "tf32,bf16", "--output-format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert not [n for n in doc.get("notes", []) if "inf/NaN" in n], doc.get("notes")
    for mode in ("tf32", "bf16"):
        measured = doc["summary"][mode]["measured_output"]
        assert measured["finite"] and measured["rel_error"] is not None
