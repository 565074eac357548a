"""The exit code and the report's place are preclint's alone: a model's code checked in preclint's
process cannot make a run with findings pass (exit handlers, signal handlers) or move where
``-o report.sarif`` lands (``os.chdir``), whatever it does at import."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.paths import ROOT

OVERFLOWS = """
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            with torch.no_grad():
                self.fc.weight.mul_(1e4)

        def forward(self, x):
            return self.fc(x) * 1e3


    model = Net()
    example_inputs = (torch.randn(2, 8) * 100,)
"""
# every way of ending the process at exit with code 0 that a model file can arrange at import
FORGES_AT_EXIT = OVERFLOWS + """
    import atexit, os, posix, sys, threading, time, weakref

    atexit.register(os._exit, 0)
    atexit.register(posix._exit, 0)
    atexit.register(sys.exit, 0)
    atexit.register(print, "printed at exit")
    weakref.finalize(sys, posix._exit, 0)
    threading.Thread(target=lambda: (time.sleep(600), posix._exit(0))).start()
    os.makedirs("elsewhere", exist_ok=True)
    elsewhere = os.path.abspath("elsewhere")
    os.chdir("elsewhere")


    def wander():  # after the model's code, while preclint writes its report
        while True:
            time.sleep(0.01)
            os.chdir(elsewhere)


    threading.Thread(target=wander, daemon=True).start()
"""
FORGES_ON_SIGTERM = OVERFLOWS + """
    import posix, signal

    signal.signal(signal.SIGTERM, lambda *args: posix._exit(0))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
"""
SLEEPS = """
    import pathlib, time

    pathlib.Path("started").write_text("")
    time.sleep(600)
"""


def _env():
    return dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")


def _write(path, text):
    path.write_text(textwrap.dedent(text))


@pytest.mark.slow
@pytest.mark.subprocess
def test_exit_handlers_and_chdir_at_import_change_neither_exit_code_nor_report_place(tmp_path):
    _write(tmp_path / "forger.py", FORGES_AT_EXIT)
    (tmp_path / "report.sarif").write_text("stale\n")  # a committed report CI would upload instead
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "preclint", "check", "forger.py", "-o", "report.sarif",
                           "--output-format", "sarif"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, proc.stderr  # the finding, not the model's 0
    assert time.monotonic() - started < 120  # the sleeping thread did not hold the process
    results = json.loads((tmp_path / "report.sarif").read_text())["runs"][0]["results"]
    assert [r["ruleId"] for r in results] == ["PCL101"]
    written = subprocess.run([sys.executable, "-m", "preclint", "check", "forger.py", "--write-baseline", "b.json"],
                             cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300)
    assert written.returncode == 0 and "PCL101" in (tmp_path / "b.json").read_text(), written.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []
    assert proc.stdout == "" and "printed at exit" not in proc.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_signal_handler_the_model_installed_does_not_decide_how_a_cancelled_run_ends(tmp_path):
    """CI cancels a run with SIGTERM: the handler a first model installed (exit 0) is not the one
    that answers while a second model is checked."""
    _write(tmp_path / "forger.py", FORGES_ON_SIGTERM)
    _write(tmp_path / "sleeps.py", SLEEPS)
    proc = subprocess.Popen([sys.executable, "-m", "preclint", "check", "forger.py", "sleeps.py"], cwd=tmp_path,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not (tmp_path / "started").exists():
        assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert err.endswith("preclint: interrupted (SIGTERM)\n")
