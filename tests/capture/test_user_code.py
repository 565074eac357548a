"""The guard around the user's code: time limit, exits, KeyboardInterrupt, stdout, warnings, signals.

In-process where the behaviour is the guard's own; in a subprocess where it is the process's (signals,
os._exit, a thread left running, writes to file descriptor 1).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings

import pytest

from preclint.core.errors import UserError
from preclint.capture.usercode import guard
from tests.paths import ROOT



def test_a_loop_ends_at_the_time_limit_with_the_line_it_was_on():
    start = time.perf_counter()
    with pytest.raises(UserError) as caught:
        with guard("model.py", 0.3):
            while True:
                pass
    assert time.perf_counter() - start < 5
    message = str(caught.value)
    assert message.startswith("model.py: gave up after 0.3 s, at ") and "test_user_code.py:" in message, message
    assert "--timeout" in message and "\n" not in message


@pytest.mark.slow
def test_a_swallowed_time_limit_is_raised_again():
    swallowed = []
    with pytest.raises(UserError, match="gave up after 0.2 s"):
        with guard("model.py", 0.2):
            try:
                while True:
                    pass
            except BaseException:  # the model's code catches everything, once
                swallowed.append(True)
            while True:
                pass
    assert swallowed == [True]


@pytest.mark.slow
def test_no_limit_and_the_alarm_is_gone_afterwards():
    with guard("model.py", 0):
        time.sleep(0.05)
    with guard("model.py", 1e300):  # longer than timers can count: no limit, not an OverflowError
        pass
    with guard("model.py", 0.5):
        pass
    time.sleep(0.7)  # an alarm left armed would interrupt this
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


@pytest.mark.parametrize(
    "body, message",
    [
        (lambda: sys.exit(5), "model.py: the model's code called sys.exit(5) at tests/capture/test_user_code.py"),
        (lambda: exit(), "called sys.exit()"),
        (lambda: os._exit(7), "called os._exit(7)"),
        (lambda: os.abort(), "called os.abort()"),
        (lambda: (_ for _ in ()).throw(KeyboardInterrupt), "raised KeyboardInterrupt"),
    ],
)
def test_ending_the_process_is_a_user_error(body, message):
    with pytest.raises(UserError) as caught:
        with guard("model.py", 10):
            body()
    assert message in str(caught.value)
    assert os._exit.__name__ == "_exit" and os.abort.__name__ == "abort"  # restored


def test_prints_go_to_stderr_and_warnings_are_recorded_not_shown(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        with guard("model.py", 10) as guarded:
            print("loading the model")
            warnings.warn("the user's own warning")
    out, err = capsys.readouterr()
    assert out == "" and err == "loading the model\n"
    assert len(guarded.warnings) == 1 and guarded.warnings == guarded.user_warnings
    assert guarded.warnings[0].startswith("tests/capture/test_user_code.py:") and "UserWarning: the user's own warning" in \
        guarded.warnings[0]


def _run(argv, cwd, **kwargs):
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300, **kwargs)


@pytest.mark.slow
@pytest.mark.subprocess
def test_hard_stop_when_the_code_never_lets_go(tmp_path):
    script = textwrap.dedent("""
        from preclint.capture import usercode
        usercode.HARD_STOP_GRACE = 0.5
        with usercode.guard("model.py", 0.2):
            while True:
                try:
                    while True:
                        pass
                except BaseException:
                    pass
    """)
    start = time.perf_counter()
    proc = _run(["-c", script], tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert time.perf_counter() - start < 60
    assert proc.stderr.count("\n") == 1 and "preclint ended without a report" in proc.stderr


EXITS = """
    import os
    os._exit(7)
"""
PRINTS_AND_LEAVES_A_THREAD = """
    import os
    import threading
    import time
    import torch
    from torch import nn

    print("print at import")
    os.write(1, b"a C extension's write to fd 1\\n")
    threading.Thread(target=time.sleep, args=(3600,)).start()

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            print("print in forward")
            return self.fc(x)

    example_inputs = (torch.randn(2, 8),)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_exit_at_import_prints_and_threads_cannot_spoil_the_run(tmp_path):
    """One process: a model that calls os._exit(7), one that prints to stdout (Python and fd 1) and leaves
    a thread running. The JSON on stdout stays one valid document holding both, the exit code is 2, and
    the process ends."""
    (tmp_path / "exits.py").write_text(textwrap.dedent(EXITS))
    (tmp_path / "noisy.py").write_text(textwrap.dedent(PRINTS_AND_LEAVES_A_THREAD))
    proc = _run(["-m", "preclint", "check", "exits.py", "noisy.py", "--output-format", "json"], tmp_path)
    assert proc.returncode == 2, proc.stderr
    exits, noisy = json.loads(proc.stdout)
    assert exits["error"].startswith("exits.py: the model's code called os._exit(7) at exits.py:3")
    assert noisy["model"] == "noisy.py:Tiny" and "error" not in noisy
    assert "print at import" in proc.stderr and "fd 1" in proc.stderr and "print in forward" in proc.stderr
    assert proc.stderr.count("preclint: error:") == 1


SLEEPS = """
    import pathlib
    import time
    pathlib.Path("started").write_text("")
    time.sleep(600)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_sigint_exits_130_and_sigterm_143_with_one_line(tmp_path):
    procs = {}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for signum in (signal.SIGINT, signal.SIGTERM):
        where = tmp_path / signum.name
        where.mkdir()
        (where / "sleeps.py").write_text(textwrap.dedent(SLEEPS))
        procs[signum] = subprocess.Popen([sys.executable, "-m", "preclint", "check", "sleeps.py"], cwd=where, env=env,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    for signum, proc in procs.items():
        while not (tmp_path / signum.name / "started").exists():
            assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        proc.send_signal(signum)
    for signum, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 128 + signum, err
        assert err == f"preclint: interrupted ({signum.name})\n" and out == ""


def test_an_interrupt_during_a_deferred_import_is_delivered_after_it():
    # numpy cut halfway by a SIGINT cannot be imported again in the process: imports of torch wait for it
    from preclint.load.interrupts import interrupts_deferred
    from preclint.capture.usercode import Interrupted, interrupt_signals

    done = []
    # a process started in the background (CI under nohup or `&`) begins with SIGINT ignored: the
    # test installs Python's own handler, which is what a terminal gives
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):  # Python's own handler, as the body found it
            with interrupts_deferred():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)  # the handler has run by now: it recorded the signal, raised nothing
                done.append("imported")
        assert done == ["imported"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)
    with pytest.raises(Interrupted) as caught, interrupt_signals():  # the CLI's handler
        with interrupts_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            done.append("again")
    assert done == ["imported", "again"] and caught.value.signum == signal.SIGTERM


def test_keyboard_interrupt_anywhere_in_the_cli_exits_130_with_one_line(tmp_path, monkeypatch, capsys):
    from preclint import cli
    from preclint.source import run as source_run

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.py").write_text("import torch\n")
    monkeypatch.setattr(source_run, "check_paths", interrupted)  # inside the run, in the source-only path
    assert cli.main(["check", "--source-only", "m.py"]) == 130
    assert capsys.readouterr().err == "preclint: interrupted (SIGINT)\n"
    monkeypatch.setattr(cli, "build_parser", interrupted)  # before preclint's handler is installed
    assert cli.main(["check", "m.py"]) == 130
    assert capsys.readouterr().err == "preclint: interrupted (SIGINT)\n"
