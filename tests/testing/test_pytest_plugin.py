"""``pytest --preclint``, run on a small suite as a user runs it (pytester): a TF32 difference is
explained as precision with a tolerance that passes, a perturbed weight as a real change, the run
without the option is unchanged, and without the option the plugin imports no torch."""
from __future__ import annotations

import os
import re

import pytest
import torch

from tests.paths import ROOT

pytest_plugins = ["pytester"]

PLUGIN = "preclint.testing.pytest_plugin"

# the suite's model: a small CNN whose activations grow, as random-init torchvision CNNs' do, so
# that its TF32 error is far above torch's default float32 tolerance
TINY = '''
import torch
from torch import nn


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.convs = nn.Sequential(*[nn.Conv2d(3 if i == 0 else 16, 16, 3, padding=1) for i in range(3)])
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        for conv in self.convs:
            x = torch.relu(conv(x)) * 3.0
        return self.head(x.mean(dim=(2, 3)))


def build():
    """The model, its input and its output recorded in float32 (as torchvision records expected outputs)."""
    torch.manual_seed(0)
    model = Stack().eval()
    x = torch.rand(2, 3, 16, 16) * 10
    with torch.no_grad():
        expected = model(x)
    return model, x, expected
'''

TF32_SUITE = '''
import torch
import preclint.testing
from tiny import build


def test_under_tf32(preclint_model):
    model, x, expected = build()
    preclint_model(model, x)
    actual = preclint.testing.output_under(model, x, "tf32")  # TF32 emulated on the CPU
    torch.testing.assert_close(actual, expected)


def test_under_tf32_with_allclose():
    model, x, expected = build()
    actual = preclint.testing.output_under(model, x, "tf32")
    assert torch.allclose(actual, expected)
'''

CHANGED_SUITE = '''
import torch
import preclint.testing
from tiny import build


def test_a_perturbed_weight():
    model, x, expected = build()
    with torch.no_grad():
        model.convs[0].weight.mul_(1.01)  # one weight, 1% off
    actual = preclint.testing.output_under(model, x, "tf32")
    torch.testing.assert_close(actual, expected)


def test_a_post_processed_output():
    model, x, expected = build()
    with torch.no_grad():
        actual = torch.softmax(model(x) * 1.5, dim=1)  # no module returned this tensor
    torch.testing.assert_close(actual, torch.softmax(expected, dim=1))


def _assert_expected(output, expected, prec):
    torch.testing.assert_close(output, expected, rtol=prec, atol=prec, check_dtype=False, check_device=False)


def test_scores_then_decisions():
    """torchvision's check_out: the scores compared, and where they differ, the decisions."""
    model, x, expected = build()
    with torch.no_grad():
        model.head.bias[expected.argmin(dim=1)[0]] += 100.0  # a change that flips a decision
        out = model(x)
    try:
        _assert_expected(out.cpu(), expected, prec=0.01)
    except AssertionError:
        torch.testing.assert_close(out.argmax(dim=1), expected.argmax(dim=1), rtol=0.01, atol=0.01)
'''


@pytest.fixture(scope="module")
def warm():
    """What the suites' runs import, imported here first: pytester's in-process run takes the modules
    it imported out of sys.modules after it, and some (torch.distributed's, which assert_close loads)
    cannot be imported twice in one process."""
    import preclint.testing
    import preclint.testing.failures  # noqa: F401

    model, x, expected = tiny_model()
    torch.testing.assert_close(expected, expected)
    preclint.testing.tolerance(model, x, "tf32")
    preclint.testing.output_under(model, x, "tf32")


@pytest.fixture
def suite(pytester, monkeypatch, warm):
    """A pytester directory holding the model; the plugin loaded with -p only (autoload off, so the
    run is the same whether or not preclint is installed with its entry point)."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    # on CI pytest prints each failure's whole message again in the short summary, which doubles the
    # counts these tests make of the explanations
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    pytester.makepyfile(tiny=TINY)
    pytester.syspathinsert()
    return pytester


def tiny_model():
    namespace = {}
    exec(compile(TINY, "tiny.py", "exec"), namespace)
    return namespace["build"]()


@pytest.mark.slow
def test_a_tf32_difference_is_explained_as_precision_with_a_tolerance_that_passes(suite):
    suite.makepyfile(test_suite=TF32_SUITE)
    result = suite.runpytest("-p", PLUGIN, "--preclint=tf32")
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.count("preclint: output computed under tf32 (") == 2, out
    assert "torch.testing.assert_close with rtol=1.30e-06, atol=1.00e-05: 20 of 20 elements outside" in out
    assert "torch.allclose with rtol=1.00e-05, atol=1.00e-08" in out
    assert out.count("a precision difference, not a change") == 2
    assert "The layers that carry tf32's error: " in out
    # the run's summary lists both, with the tolerance that passes
    summary = out.split("= preclint =")[1]
    assert "test_suite.py::test_under_tf32: precision: output under tf32" in summary
    assert "test_suite.py::test_under_tf32_with_allclose: precision: output under tf32" in summary
    assert "2 precision differences (2 failed comparisons)" in summary
    rtol, atol = map(float, re.search(r"The tolerance tf32 can meet passes it: rtol=(\S+), atol=(\S+) ", out).groups())
    model, x, expected = tiny_model()
    import preclint.testing

    actual = preclint.testing.output_under(model, x, "tf32")
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)


@pytest.mark.slow
def test_a_perturbed_weight_is_explained_as_a_real_change(suite):
    """The model is found without the fixture: the one whose output was compared. A tensor no
    module returned is left unexplained, with the line that says how to name the model."""
    suite.makepyfile(test_suite=CHANGED_SUITE)
    result = suite.runpytest("-p", PLUGIN, "--preclint=tf32")
    result.assert_outcomes(failed=3)
    out = result.stdout.str()
    changed, rest = out.split(" test_a_post_processed_output ", 1)  # each test's failure, by its header
    post_processed, decisions = rest.split(" test_scores_then_decisions ", 1)
    assert "preclint: output computed under tf32 (computed by preclint.testing.output_under)" in changed
    assert "beyond the margin of 3: a real change (weights, inputs, code), not rounding" in changed
    assert "fails it too" in changed
    assert "preclint: not explained: no module called in the test returned the compared tensor" in post_processed
    summary = out.split("= preclint =")[1]
    assert "test_suite.py::test_a_perturbed_weight: real change: output under tf32" in summary
    assert "test_suite.py::test_a_post_processed_output: not explained: " in summary
    # the decisions' failure is explained by the scores' before it, which the test handled
    assert "preclint: the comparison of values that failed first, whose AssertionError the test handled" in decisions
    assert "torch.testing.assert_close with rtol=1.00e-02, atol=1.00e-02" in decisions and "a real change" in decisions
    assert "test_suite.py::test_scores_then_decisions: real change: output under tf32" in summary
    assert "2 real changes, 1 not explained (3 failed comparisons)" in summary


@pytest.mark.slow
def test_a_bare_option_infers_the_precision_from_autocast(suite):
    suite.makepyfile(test_suite='''
import unittest

import torch
from tiny import build


def test_under_autocast():
    model, x, expected = build()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = model(x)
    torch.testing.assert_close(actual.float(), expected)


class TestModels(unittest.TestCase):
    def test_under_autocast(self):
        model, x, expected = build()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            actual = model(x)
        self.assertTrue(torch.allclose(actual.float(), expected))
''')
    result = suite.runpytest("-p", PLUGIN, "--preclint", "test_suite.py")  # the path is not the precision
    result.assert_outcomes(failed=2)
    out = result.stdout.str()
    assert out.count("preclint: output computed under bf16 (inferred: autocast('cpu', bfloat16) was on)") == 2, out
    assert "torch.allclose with rtol=1.00e-05, atol=1.00e-08" in out  # the unittest case's
    assert out.count("a precision difference, not a change") == 2


@pytest.mark.slow
def test_a_compiled_model_is_explained_and_warns_nothing(suite):
    """torch warns of global module hooks when a module is compiled; a suite run with -W error must not fail on it."""
    suite.makepyfile(test_suite='''
import torch
from tiny import build


def test_compiled():
    model, x, expected = build()
    with torch.no_grad():
        model.convs[0].weight.mul_(1.01)
        out = torch.compile(model, backend="eager")(x)
    torch.testing.assert_close(out, expected)
''')
    # in a process of its own: -W error turns any warning of the run into an error, and in this process
    # the plugin may already be imported (pytest warns it cannot rewrite it), which is no warning of a suite's
    result = suite.runpytest_subprocess("-p", PLUGIN, "--preclint=tf32", "-W", "error")
    result.assert_outcomes(failed=1)
    assert "test_suite.py::test_compiled: real change: output under tf32" in result.stdout.str()


UNCHANGED_SUITE = '''
import torch
from tiny import build


def test_named(preclint_model):
    model, x, expected = build()
    assert preclint_model(model, x) is model
    torch.testing.assert_close(model(x) * 1.01, expected)


def test_plain():
    model, x, expected = build()
    torch.testing.assert_close(model(x) * 1.01, expected)


def test_torch_untouched():
    assert type(torch.allclose).__name__ == "builtin_function_or_method"
    assert not torch.nn.modules.module._global_forward_hooks
'''


@pytest.mark.slow
def test_without_the_option_the_run_is_unchanged(suite):
    suite.makepyfile(test_suite=UNCHANGED_SUITE)
    loaded = suite.runpytest("-p", PLUGIN)
    loaded.assert_outcomes(failed=2, passed=1)
    assert "preclint:" not in loaded.stdout.str() and "= preclint =" not in loaded.stdout.str()
    absent = suite.runpytest("-k", "plain or untouched")
    absent.assert_outcomes(failed=1, passed=1)

    def failure(result):
        return [line for line in result.stdout.lines if line.startswith("E ")]

    assert failure(absent) and failure(absent) == failure(suite.runpytest("-p", PLUGIN, "-k", "plain or untouched"))


@pytest.mark.slow
@pytest.mark.subprocess
def test_without_the_option_the_plugin_imports_no_torch(suite, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    suite.makepyfile(test_imports='''
import sys


def test_nothing_heavy_was_imported(preclint_model):
    assert preclint_model("a model") == "a model"  # the fixture is there, and does nothing
    assert "torch" not in sys.modules
    assert sorted(m for m in sys.modules if m.startswith("preclint")) == [
        "preclint", "preclint.testing", "preclint.testing.pytest_plugin"]
''')
    result = suite.runpytest_subprocess("-p", PLUGIN, "test_imports.py")
    result.assert_outcomes(passed=1)


def test_an_unknown_precision_is_one_line(suite):
    result = suite.runpytest("-p", PLUGIN, "--preclint=tf23")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "--preclint=tf23: unknown precision (known: fp32, tf32" in result.stderr.str()


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_gpu_tf32_convolutions_are_inferred_and_explained_as_precision(suite):
    """test_models.py's case: the output recorded in float32 on the CPU, compared on an Ampere or
    newer GPU, where cuDNN runs float32 convolutions in TF32 by default."""
    # convolutions as wide as a ResNet's: cuDNN runs tiny ones (16 channels) in float32 even with
    # TF32 allowed (benchmarks/README.md, Emulation against the GPU), and the test would pass
    suite.makepyfile(test_suite='''
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(64, 256, 3, padding=1), nn.ReLU(), nn.Conv2d(256, 256, 3, padding=1)).eval()
    x = torch.rand(8, 64, 32, 32)
    with torch.no_grad():
        expected = model(x)
    return model, x, expected


def test_on_the_gpu():
    model, x, expected = build()
    torch.backends.cudnn.allow_tf32 = True  # torch's default
    out = model.cuda()(x.cuda())
    torch.testing.assert_close(out.cpu(), expected)
''')
    result = suite.runpytest("-p", PLUGIN, "--preclint")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "computed under tf32 (inferred: TF32 was allowed for cuDNN convolutions (torch's default))" in out, out
    assert "a precision difference, not a change" in out, out


def test_the_entry_point_names_the_plugin():
    """pytest loads the plugin where preclint is installed through this entry point (-p no:preclint keeps it out)."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.entry-points.pytest11]", 1)[1].split("\n[", 1)[0]
    assert re.search(r'^preclint = "preclint\.testing\.pytest_plugin"$', section, re.M), section
    import preclint.testing.pytest_plugin as plugin

    assert callable(plugin.pytest_addoption) and callable(plugin.pytest_configure)


# a model called in train mode: its batch norm normalises by the batch's statistics, which turn small
# inputs into unit-scale values (in eval mode, with its initial running statistics, it passes them
# through nearly unchanged); and one with dropout active
TRAIN_MODE_SUITE = '''
import copy

import pytest
import torch
from torch import nn


def build(seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 8))  # train mode
    return model, torch.randn(8, 16) * 0.01 + 0.05


@pytest.mark.parametrize("seed", range(6))
def test_bf16_in_train_mode(seed, preclint_model):
    model, x = build(seed)
    expected = copy.deepcopy(model)(x)
    preclint_model(model, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = model(x)
    torch.testing.assert_close(actual.float(), expected.detach())


def test_a_changed_weight_in_train_mode(preclint_model):
    model, x = build(0)
    expected = copy.deepcopy(model)(x)
    with torch.no_grad():
        model[3].weight[0] += 1.0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = model(x)
    torch.testing.assert_close(actual.float(), expected.detach())


def test_dropout_active(preclint_model):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.5), nn.Linear(32, 8))
    x = torch.randn(8, 16)
    expected = model(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        actual = model(x)
    torch.testing.assert_close(actual.float(), expected.detach())
'''


@pytest.mark.slow
def test_train_mode_is_judged_as_the_model_was_called_and_dropout_is_not_deterministic(suite):
    """A pure bf16 difference of a model with BatchNorm in train mode was called "a real change (weights,
    inputs, code)" (for 6 of these 6 seeds): the error was predicted for the model in eval mode."""
    suite.makepyfile(test_suite=TRAIN_MODE_SUITE)
    result = suite.runpytest("-p", PLUGIN, "--preclint")
    result.assert_outcomes(failed=8)
    out = result.stdout.str()
    summary = out.split("= preclint =")[1]
    for seed in range(6):
        assert f"test_suite.py::test_bf16_in_train_mode[{seed}]: precision: output under bf16" in summary
    assert "measured on cpu (emulated), in train mode as the model was called" in out
    assert "The model was called in train mode, and its batch statistics (1 (BatchNorm1d))" in out
    assert "test_suite.py::test_a_changed_weight_in_train_mode: real change: output under bf16" in summary
    assert "test_suite.py::test_dropout_active: not deterministic: output under bf16, dropout active" in summary
    assert "with dropout active (1 (Dropout))" in out and "neither a precision difference nor a change" in out
    assert "6 precision differences, 1 real change, 1 not deterministic comparison (8 failed comparisons)" in summary
