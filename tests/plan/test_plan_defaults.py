"""`preclint plan` as a user first runs it: with --rtol alone."""
import json

import pytest

from preclint.cli import main

SMALL_CNN = """\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(), nn.Conv2d(16, 8, 3), nn.Flatten(), nn.Linear(8 * 12 * 12, 10)).eval()
example_inputs = (torch.rand(2, 3, 16, 16),)
"""


@pytest.mark.slow
def test_plan_with_rtol_alone_gets_an_atol_at_the_outputs_scale(tmp_path, capsys):
    # atol defaulted to 0: every element near 0 failed at any precision, so float32 itself "missed" the
    # tolerance and the plan was refused (exit 2) on an ordinary model
    path = tmp_path / "model.py"
    path.write_text(SMALL_CNN)
    code = main(["plan", str(path), "--rtol", "1e-2", "--no-verify", "--output-format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    atol = plan["tolerance"]["atol"]
    assert 0 < atol < 1e-2
    assert plan["meets_tolerance"] is True
    note = next(n for n in plan["notes"] if n.startswith("atol defaults to rtol x RMS"))
    assert "--atol" in note


@pytest.mark.slow
def test_an_atol_given_is_kept(tmp_path, capsys):
    path = tmp_path / "model.py"
    path.write_text(SMALL_CNN)
    code = main(["plan", str(path), "--rtol", "1e-2", "--atol", "1e-3", "--no-verify", "--output-format", "json"])
    plan = json.loads(capsys.readouterr().out)
    assert code == 0 and plan["tolerance"]["atol"] == 1e-3
    assert not any(n.startswith("atol defaults") for n in plan["notes"])


PATCH_EMBEDDING = """\
import torch
torch.manual_seed(0)
model = torch.nn.Conv2d(3, 96, kernel_size=8, stride=8).eval()
example_inputs = (torch.rand(1, 3, 64, 64),)
"""


@pytest.mark.slow
def test_a_patch_embedding_plan_keeps_the_weight_its_float16_rounding_spoils(tmp_path, capsys):
    # TensorRT's FP16 patch embedding at rtol 1e-3, atol 1e-5: the plan kept the conv (100% of the
    # FLOPs) and still failed, since the conv's weight stayed float16, whose rounding held most of the error
    path = tmp_path / "patch.py"
    path.write_text(PATCH_EMBEDDING)
    code = main(["plan", str(path), "--precision", "fp16-full", "--rtol", "1e-3", "--atol", "1e-5", "--no-verify",
                 "--output-format", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    plan = json.loads(out)
    kept = {k["module"] for k in plan["keep"]}
    assert "<param:weight>" in kept and "<inputs>" in kept
    assert plan["meets_tolerance"] is True
