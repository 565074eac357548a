"""preclint.check, the Python API: the report the command line prints, in each of its forms, and the
process left as it was found whatever the model's code changed."""
from __future__ import annotations

import json
import random
import subprocess
import sys

import numpy
import pytest
import torch
from torch import nn

import preclint
from preclint.capture import global_state
from preclint.cli import main
from preclint.core.errors import UserError
from tests.paths import ROOT


def through(function, *args, **kwargs):
    # (one line for both the command line and the API: a recorded capture places the model's inputs at
    # the line of the caller's code that started the walk)
    return function(*args, **kwargs)


def cli(capsys, *argv):
    code = through(main, list(argv))
    out, _ = capsys.readouterr()
    return code, out


def built(path):
    """The model and inputs of the tiny model file, built as a user's own code would build them."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("tiny_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)  # the weights the loader draws (--seed 0)
    model = module.Tiny()
    return model, module.example_inputs()


@pytest.mark.slow
@pytest.mark.subprocess
def test_import_preclint_needs_no_torch_and_names_the_api():
    code = ("import sys, preclint; assert 'torch' not in sys.modules, 'torch imported'; "
            "assert callable(preclint.check) and preclint.check is preclint.api.check; "
            "assert preclint.testing.tolerance.__module__ == 'preclint.testing.tolerances'; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.slow
def test_the_api_returns_what_the_command_line_prints(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, printed = cli(capsys, "check", tiny, "--precision", "tf32,fp16", "--output-format", "json", "--isolated")
    report = preclint.check(tiny, precisions=("tf32", "fp16"))
    assert report.to_json() == printed
    # the same model built in Python: the same document, but for the name the path gave it
    model, inputs = built(tiny)
    from_module = preclint.check(model, inputs, precisions=("tf32", "fp16"))
    document, expected = from_module.to_dict(), json.loads(printed)
    assert document.pop("model") == "Tiny" and expected.pop("model").endswith("tiny.py:Tiny")
    assert document == expected
    # the output table holds the numbers the document does
    for mode, row in from_module.outputs.items():
        assert row.rel_error == expected["summary"][mode]["predicted_output"]["rel_error"]
        assert [share for _, _, share in row.top_layers] == [t["share"] for t in expected["summary"][mode]["top_layers"]]


@pytest.mark.slow
def test_a_probed_report_is_what_preclint_probe_prints_and_its_page(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, printed = cli(capsys, "probe", tiny, "--device", "cpu", "--precision", "tf32", "--output-format", "json",
                        "--isolated")
    report = through(preclint.check, tiny, precisions=("tf32",), probe="cpu")
    assert report.to_json() == printed
    assert report.ledger and report.outputs["tf32"].measured_rel_error is not None
    page = tmp_path / "page.html"
    cli(capsys, "check", tiny, "--probe", "cpu", "--precision", "tf32", "--output-format", "html", "--isolated",
        "--output", str(page))
    assert report._repr_html_() == page.read_text(encoding="utf-8")


@pytest.mark.slow
def test_the_page_without_a_probe_is_the_command_line_s(tiny, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    page = tmp_path / "page.html"
    cli(capsys, "check", tiny, "--precision", "bf16", "--output-format", "html", "--isolated", "--output", str(page))
    assert through(preclint.check, tiny, precisions=("bf16",))._repr_html_() == page.read_text(encoding="utf-8")


class Meddler(nn.Module):
    """A model whose forward changes every process-wide setting preclint.check promises to restore."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        torch.manual_seed(1234)
        random.seed(1)
        numpy.random.seed(1)
        torch.set_default_dtype(torch.float64)
        torch.backends.cudnn.conv.fp32_precision = "ieee"
        torch.set_float32_matmul_precision("medium")
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.deterministic = True
        torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
        torch.backends.cuda.enable_flash_sdp(False)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_num_threads(1)
        torch.set_anomaly_enabled(True)
        torch.set_autocast_cache_enabled(False)
        torch.autocast("cpu", dtype=torch.float16).__enter__()  # and never left
        y = self.fc(x.float()).float()
        torch.set_grad_enabled(False)
        return y


@pytest.mark.parametrize("probe", [None, pytest.param("cpu", marks=pytest.mark.slow)])
def test_a_model_that_changes_every_setting_leaves_none_changed(probe):
    model, x = Meddler().train(), torch.randn(2, 8)
    before = global_state.snapshot()
    threads = torch.get_num_threads()
    try:
        preclint.check(model, x, precisions=("tf32", "bf16"), probe=probe)
    except UserError:
        pass  # a check the meddling broke must leave the process as it found it all the same
    assert global_state.changed(before, global_state.snapshot()) == []
    assert model.training and torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert not torch.is_autocast_enabled("cpu") and torch.get_num_threads() == threads


def test_the_settings_a_model_changes_are_each_seen_changed():
    # (the snapshot the test above compares reads each setting the meddler changes)
    before = global_state.snapshot()
    with global_state.preserved():
        try:
            Meddler()(torch.randn(2, 8))
        finally:
            inside = global_state.snapshot()
    changed = global_state.changed(before, inside)
    for name in ("torch.get_rng_state()", "random.getstate()", "numpy.random.get_state()", "torch.get_default_dtype()",
                 "float32 precision (TF32)",
                 "torch.backends.cudnn.benchmark", "torch.backends.cudnn.deterministic",
                 "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction",
                 "torch.backends.cuda.flash_sdp_enabled()", "torch.use_deterministic_algorithms()",
                 "torch.get_num_threads()", "torch.set_anomaly_enabled()", "torch.is_autocast_cache_enabled()",
                 "torch.is_autocast_enabled('cpu')", "torch.get_autocast_dtype('cpu')", "autocast nesting",
                 "torch.is_grad_enabled()"):
        assert name in changed, name
    assert global_state.changed(before, global_state.snapshot()) == []


def test_mistakes_in_the_call_are_one_line_errors(tiny):
    with pytest.raises(UserError, match="probe must be"):
        preclint.check(tiny, probe="gpu")
    with pytest.raises(UserError, match="unknown precision"):
        preclint.check(tiny, precisions=("fp6",))
    with pytest.raises(UserError, match="give the inputs"):
        preclint.check(nn.Linear(2, 2))
    with pytest.raises(UserError, match="plan takes one --precision"):
        preclint.check(nn.Linear(2, 2), torch.randn(1, 2), plan=True, rtol=1e-3, atol=1e-3)


@pytest.mark.slow
def test_keyword_inputs_and_a_plan(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    class Keyed(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x, *, scale):
            return self.fc(x) * scale

    torch.manual_seed(0)
    report = preclint.check(Keyed(), preclint.inputs(torch.randn(4, 16), scale=torch.tensor(3.0)),
                            precisions="fp16", rtol=1e-3, atol=1e-6, plan=True)
    assert report.plan is not None and report.plan.precision == "fp16"
    assert "PCL001" in {f.code for f in report.findings}
    assert "plan" in repr(report)


def test_an_output_row_reads_its_figures_from_the_predicted_and_measured_records():
    from preclint.api import OutputError
    from preclint.core.findings import ErrorFigure

    row = OutputError("tf32", ErrorFigure(1e-3, 2e-3, finite=True), ErrorFigure(3e-3, 5e-3, 0.25, finite=False))
    assert (row.rel_error, row.max_abs_error, row.finite) == (1e-3, 2e-3, True)
    assert (row.measured_rel_error, row.measured_max_abs_error, row.measured_finite,
            row.measured_flip_fraction) == (3e-3, 5e-3, False, 0.25)
    unmeasured = OutputError("tf32", ErrorFigure(1e-3, 2e-3, finite=True))
    assert unmeasured.measured_rel_error is None and unmeasured.measured_finite is None
