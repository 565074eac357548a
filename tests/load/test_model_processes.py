"""The processes a model's code starts end with preclint's run: `preclint check model.py | cat` returns
when preclint is done, not when the model's children are, and none of them is left running, whether
the check succeeds, fails, hits --timeout or is interrupted."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from tests.paths import ROOT

SLEEP = 3600  # seconds the children would live: far longer than any run is allowed here
RUN_LIMIT = 300  # seconds a run may take on a loaded machine (a check takes seconds)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="descendants are found in /proc")

NET = """
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            {forward}
            return self.fc(x)

    example_inputs = (torch.randn(2, 8),)
"""

HEAD = """
    import multiprocessing, os, signal, subprocess, time
    import torch
    from torch import nn

    def record(pid):
        with open(os.environ["CHILD_PIDS"], "a") as f:
            f.write(f"{{pid}}\\n")
"""

MODELS = {
    # a child forked at import that sleeps, holding the stdout and stderr it inherited
    "forks at import": HEAD + """
    pid = os.fork()
    if pid == 0:
        time.sleep({sleep})
        os._exit(0)
    record(pid)
""" + NET.replace("{forward}", "pass"),
    # a fork that does not exit: the child comes back into preclint, which must not check the model twice
    "a fork that comes back": HEAD + """
    if os.fork() == 0:
        record(os.getpid())
""" + NET.replace("{forward}", "pass"),
    # a subprocess started in forward (which runs several times in a check)
    "Popen in forward": HEAD + NET.replace("{forward}", "record(subprocess.Popen(['sleep', '{sleep}']).pid)"),
    # a multiprocessing worker started by the build function
    "multiprocessing in the build function": HEAD + NET.replace("{forward}", "pass") + """
    def build():
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=({sleep},))
        worker.start()
        record(worker.pid)
        return Net()
""",
    # a daemon: double fork and setsid, its own session, SIGTERM ignored (it takes the SIGKILL)
    "a daemon that ignores SIGTERM": HEAD + """
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            record(os.getpid())
            time.sleep({sleep})
        os._exit(0)
""" + NET.replace("{forward}", "pass"),
    # a forward stuck waiting for its subprocess, ended by --timeout
    "a forward stuck on its subprocess": HEAD + NET.replace(
        "{forward}", "child = subprocess.Popen(['sleep', '{sleep}']); record(child.pid); child.wait()"),
}
ARGS = {"multiprocessing in the build function": ["--model", "build"],
        "a forward stuck on its subprocess": ["--timeout", "3"]}
EXPECTED = {"a forward stuck on its subprocess": (2, "gave up after 3 s")}


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def _pids(path: Path):
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def _end(pids) -> None:
    """What a failing run left behind, ended so that it does not outlive the test."""
    for pid in pids:
        if _running(pid):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("case", list(MODELS))
def test_a_pipeline_returns_with_preclint_and_the_model_s_children_are_gone(tmp_path, case):
    (tmp_path / "model.py").write_text(textwrap.dedent(MODELS[case].format(sleep=SLEEP)))
    pids_file = tmp_path / "pids"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1", CHILD_PIDS=str(pids_file))
    command = " ".join([sys.executable, "-m", "preclint", "check", "model.py", "--output-format", "concise",
                        *ARGS.get(case, [])])
    try:  # pipefail: the pipeline's status is preclint's, not cat's
        done = subprocess.run(["bash", "-c", f"set -o pipefail; {command} 2>&1 | cat"], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=RUN_LIMIT)
    finally:
        pids = _pids(pids_file)
        left = [pid for pid in pids if _running(pid)]
        _end(pids)
    code, needle = EXPECTED.get(case, (0, "All checks passed!"))
    assert done.returncode == code and done.stdout.count(needle) == 1, done.stdout  # cat passed it all on, once
    assert pids and not left, (pids, left)


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigterm_ends_preclint_and_the_model_s_children(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(MODELS["a forward stuck on its subprocess"].format(sleep=SLEEP)))
    pids_file = tmp_path / "pids"
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1", CHILD_PIDS=str(pids_file))
    proc = subprocess.Popen([sys.executable, "-m", "preclint", "check", "model.py", "--timeout", "0"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + RUN_LIMIT
        while not _pids(pids_file):
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=RUN_LIMIT)  # EOF on its pipes: no child holds them
    finally:
        pids = _pids(pids_file)
        left = [pid for pid in pids if _running(pid)]
        _end(pids)
        proc.kill()
    assert proc.returncode == 143 and err == "preclint: interrupted (SIGTERM)\n" and out == "", err
    assert not left, (pids, left)
