"""`preclint diff` where one side is broken: weights that hold inf/NaN or a negative batch-norm running
variance, and an fp16 output that overflows though the float32 outputs agree. Each was called "does not
part" or "not compared: an output error is not known", exit 0; the answer is that side, named first as
the fragile one, with exit code 1."""
from __future__ import annotations

import json
import math

import jsonschema
import pytest
import torch

from preclint.cli import main
from preclint.diff.ledgers import Ledger, LayerRow, compare_ledgers
from preclint.measure.compare import LARGEST, relative_rms
from preclint.diff.weights import invalid_values
from tests.paths import DATA

NET = """
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8)).eval()
example_inputs = (torch.randn(4, 16),)
"""


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 8)).eval()


def _changed(state, change):
    changed = {k: v.clone() for k, v in state.items()}
    change(changed)
    return changed


def _nan(s):
    s["0.weight"][0, 0] = float("nan")


def _inf(s):
    s["0.weight"][0, 0] = float("inf")


def _negative_variance(s):
    s["1.running_var"][0] = -1.0


def _folded_scale(s):
    # a batch-norm scale of 1e6 undone by the next layer: float32's outputs are the same, fp16's overflow
    s["1.weight"] *= 1e6
    s["1.bias"] *= 1e6
    s["3.weight"] /= 1e6


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("fragile")
    (folder / "net.py").write_text(NET)
    state = _net().state_dict()
    torch.save(state, folder / "a.pt")
    for name, change in (("nan", _nan), ("inf", _inf), ("negvar", _negative_variance), ("big", _folded_scale)):
        torch.save(_changed(state, change), folder / f"{name}.pt")
    return folder


def _diff(capsys, files, b, *extra):
    code = main(["diff", str(files / "net.py"), "--weights", str(files / "a.pt"), "--weights", str(files / f"{b}.pt"),
                 "-q", *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
@pytest.mark.parametrize("b, invalid, at", [
    ("nan", "0.weight holds 1 NaN of 512 values", "model[0] (Linear), already in float32"),
    ("inf", "0.weight holds 1 inf of 512 values", "model[0] (Linear), already in float32"),
    ("negvar", "1.running_var holds 1 negative variance", "model[1] (BatchNorm1d), already in float32"),
])
def test_invalid_weights_are_said_first_and_that_side_is_the_fragile_one(capsys, files, b, invalid, at):
    code, out, err = _diff(capsys, files, b)
    assert code == 1, err
    lines = out.splitlines()
    assert lines[2].startswith(f"{b}'s weights are not valid: {invalid}") and lines[2].endswith(f"{b} is the fragile one.")
    assert lines[3] == f"{b}'s fp16 output is inf/NaN (it overflows first at {at}), where a's error is 6.40e-04: " \
                       f"{b} is the fragile one."
    assert "do not part" not in out and "not known" not in out
    assert "(difference inf," in lines[4]
    assert _diff(capsys, files, b, "--exit-zero")[0] == 0
    # SARIF: the broken side is an error result (a run that exits 1 says why)
    code, out, err = _diff(capsys, files, b, "--output-format", "sarif")
    document = json.loads(out)
    jsonschema.validate(document, json.loads((DATA / "sarif-schema-2.1.0.json").read_text()))
    results = [r for r in document["runs"][0]["results"] if r["ruleId"] == "diff/fragile"]
    assert code == 1 and {r["level"] for r in results} == {"error"}
    assert any(f"{b}'s weights are not valid" in r["message"]["text"] for r in results)


@pytest.mark.slow
def test_an_fp16_overflow_names_the_checkpoint_and_the_block(capsys, files):
    code, out, err = _diff(capsys, files, "big", "--output-format", "json")
    assert code == 1, err
    doc = json.loads(out)
    assert doc["summary"][0] == ("big's fp16 output is inf/NaN (it overflows first at model[1] (BatchNorm1d)), where "
                                 "a's error is 6.40e-04: big is the fragile one.")
    assert doc["fragile"] == ["big's fp16 output is inf/NaN, first at model[1] (BatchNorm1d)"]
    fp16 = doc["precisions"][0]
    assert fp16["output_finite"] == {"a": True, "big": False} and fp16["error"] is None
    assert fp16["overflows_at"] == {"big": "model[1] (BatchNorm1d)"}
    # the runs part where B's block overflows, not "do not part"
    assert doc["parting"]["first_divergent"]["module"] == "1" and doc["parting"]["output_non_finite"]
    assert doc["checkpoints"]["big"]["invalid"] == []
    # bf16 holds the same checkpoint: no side is broken there, exit 0
    assert _diff(capsys, files, "big", "--precision", "bf16")[0] == 0


def test_invalid_values_are_named_per_tensor():
    net = _net()
    assert invalid_values(net) == []
    with torch.no_grad():
        net[0].bias[:3] = float("nan")
        net[3].weight[0, 0] = -float("inf")
        net[1].running_var[:2] = torch.tensor([-1e-3, -2.0])
    assert invalid_values(net) == ["0.bias holds 3 NaN of 32 values", "3.weight holds 1 inf of 256 values",
                                   "1.running_var holds 2 negative variances (smallest -2)"]


def _ledger(error):
    return Ledger("fp16", error, {"x": LayerRow("x", "a", "nn.Linear", "linear", None, 1e-3, 1e-3, 1.0)}, measured=False)


@pytest.mark.parametrize("first", [True, False])
def test_an_infinite_error_is_the_largest_not_an_unknown_one(first):
    ledgers = [_ledger(1e-3), _ledger(math.inf)]
    ledgers[1].overflow_at = "block.bn (BatchNorm2d)"
    if first:
        ledgers.reverse()
    labels = ("A", "B") if not first else ("B", "A")
    diff = compare_ledgers(ledgers[0], ledgers[1], labels)
    assert diff.error is None
    assert diff.sentence == ("B's fp16 output is inf/NaN (it overflows first at block.bn (BatchNorm2d)), where A's "
                             "error is 0.001: B is the fragile one")
    both = compare_ledgers(_ledger(math.inf), _ledger(math.inf), ("A", "B"))
    assert both.sentence == "Both A's and B's fp16 outputs are inf/NaN" and both.ratio is None


def _relative(outs, theirs):
    return relative_rms(outs, theirs, nonfinite=LARGEST)  # how diff compares two settings' values


def test_a_value_inf_in_one_run_only_is_an_infinite_difference():
    finite = torch.tensor([1.0, 2.0, 3.0])
    assert _relative([torch.tensor([1.0, float("inf"), 3.0])], [finite]) == math.inf
    assert _relative([torch.tensor([1.0, float("nan"), 3.0])], [finite]) == math.inf
    # the same inf/NaN in both runs: they agree there, and differ by the rest
    same = torch.tensor([float("nan"), float("inf"), 3.0])
    assert _relative([same], [same.clone()]) == 0.0
    assert _relative([torch.tensor([float("nan"), 2.0, 6.0])], [torch.tensor([float("nan"), 2.0, 3.0])]) == \
        pytest.approx(3.0 / math.sqrt(13.0))


@pytest.mark.slow
def test_a_probe_that_cannot_measure_nan_weights_still_names_the_checkpoint(capsys, files):
    """The probe has no finite float64 reference to measure against: one line, exit 2, and it says which."""
    code, out, err = _diff(capsys, files, "nan", "--probe", "cpu")
    assert code == 2 and err.count("\n") == 1
    assert "nan's weights are not valid (0.weight holds 1 NaN of 512 values): nan is the fragile one; " in err
