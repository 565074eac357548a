"""Progress bars: on a terminal's stderr for long work; nothing when stderr is piped, in CI or with --quiet."""
from __future__ import annotations

import io
import sys

import pytest

from preclint.core import progress
from preclint.cli import main

NET = """\
import torch.nn as nn


class Net(nn.Sequential):
    def __init__(self):
        super().__init__(*[nn.Linear(16, 16) for _ in range(6)])
"""
ARGS = ["--model", "Net", "--input-shape", "2,16", "--exit-zero"]


class Terminal(io.StringIO):
    """A stderr that says it is a terminal, as the one a person watches does."""

    def isatty(self) -> bool:
        return True


@pytest.fixture
def run(tmp_path, monkeypatch):
    """Run preclint with stderr a terminal (or not); the bar's delay is 0, so that a short check
    stands in for a long one. Returns (exit code, stderr)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET)
    monkeypatch.setattr(progress, "DELAY", 0.0)
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")

    def run(*argv, terminal=True):
        err = Terminal() if terminal else io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        code = main(list(argv))
        monkeypatch.setattr(progress, "_enabled", False)
        return code, err.getvalue()

    return run


def test_a_terminal_sees_the_reference_pass_and_the_probe_stages(run):
    code, err = run("check", "net.py", *ARGS)
    assert code == 0 and "reference pass" in err
    code, err = run("probe", "net.py", *ARGS, "--device", "cpu", "--output-format", "json")
    assert code == 0 and "probe: " in err


@pytest.mark.slow
def test_a_terminal_sees_the_plans_runs(run):
    # a tolerance bfloat16 misses without a plan: the plan is run as well
    code, err = run("plan", "net.py", "--model", "Net", "--input-shape", "2,16", "--precision", "bf16",
                    "--rtol", "1e-3", "--atol", "1e-5", "--output-format", "json")
    assert code in (0, 1) and "plan: run 1 (without a plan)" in err and "plan: run 2 (with the plan)" in err
    # one bfloat16 meets without a plan: no run is spent on one
    code, err = run("plan", "net.py", "--model", "Net", "--input-shape", "2,16", "--precision", "bf16",
                    "--rtol", "1e-1", "--output-format", "json")
    assert code == 0 and "plan: run 1 (without a plan)" in err and "plan: run 2" not in err


@pytest.mark.parametrize("how", ["quiet", "piped", "ci"])
def test_nothing_extra_when_piped_in_ci_or_quiet(run, monkeypatch, how):
    if how == "ci":
        monkeypatch.setenv("CI", "true")
    extra = ["--quiet"] if how == "quiet" else []
    code, err = run("check", "net.py", *ARGS, *extra, terminal=how != "piped")
    assert code == 0 and err == ""


def test_short_work_shows_no_bar(run, monkeypatch):
    monkeypatch.setattr(progress, "DELAY", 60.0)
    code, err = run("check", "net.py", *ARGS)
    assert code == 0 and err == ""
