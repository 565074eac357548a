"""A model bound to one device (an FNO that builds its grid on the CPU in its forward) under a probe
on another: the check keeps its findings and predictions, and the probe's failure is one note that
says why, not a failed run."""
import json

import pytest
import torch

import preclint.probe
from preclint.cli import main
from preclint.probe.device_copy import place
from tests.paths import MODELS

FNO = str(MODELS / "fno_cpu_grid.py")


def checked(capsys, *argv):
    code = main(["check", "--isolated", FNO, "--output-format", "json", *argv])
    out, err = capsys.readouterr()
    return code, json.loads(out), err


@pytest.mark.slow
def test_a_probe_device_the_model_cannot_run_on_keeps_the_check_and_says_why(capsys, monkeypatch):
    # no GPU here: the probe's device is the meta device, where the forward's CPU grid meets the
    # moved input as it meets a CUDA one (torch: "Tensor on device cpu is not on the expected device meta!")
    monkeypatch.setattr(preclint.probe, "place_for_probe",
                        lambda loaded, options: place(loaded.module, loaded.inputs, torch.device("meta"), force=True))
    code, report, err = checked(capsys, "--probe", "cpu")
    assert code == 0, err
    plain_code, plain, _ = checked(capsys)
    for mode in ("tf32", "fp16", "bf16"):  # the check's numbers, as without a probe
        assert report["summary"][mode]["predicted_output"] == plain["summary"][mode]["predicted_output"]
        assert "measured_output" not in report["summary"][mode]
    (note,) = [n for n in report["notes"] if n.startswith("probe: not run")]
    assert "cannot run on meta" in note and "not on the expected device" in note and "--probe cpu" in note


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_the_fno_is_checked_and_the_probe_says_why_it_could_not_run(capsys):
    code, report, err = checked(capsys, "--probe", "cuda")
    assert code == 0, err
    assert report["summary"]["bf16"]["predicted_output"]["rel_error"] > 0
    (note,) = [n for n in report["notes"] if n.startswith("probe: not run")]
    assert "cannot run on cuda" in note
