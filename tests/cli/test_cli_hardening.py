"""`preclint check` as an adversarial user meets it: mistakes end in one line and exit 2, a run with
several models prints one valid document, nothing the user gave is replaced or lost."""
from __future__ import annotations

import json
import os
import pickle
import stat
import textwrap
import threading

import jsonschema
import pytest

from preclint.cli import main
from preclint.core.errors import UserError
from preclint.report.output import write_output_file
from preclint.source.baseline import read_baseline
from tests.paths import ROOT, DATA

SARIF_SCHEMA = json.loads((DATA / "sarif-schema-2.1.0.json").read_text())

TINY = """
    import torch
    from torch import nn

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return self.fc(x)

    example_inputs = (torch.randn(2, 8),)
"""
FAILS = TINY.replace("return self.fc(x)", 'raise RuntimeError("this model always fails")')
NAN_OUTPUT = TINY.replace("return self.fc(x)", "return torch.log(self.fc(x) - 100.0)")
GENERATOR = TINY.replace("return self.fc(x)", "yield self.fc(x)")
EXITS_IN_FORWARD = TINY.replace("return self.fc(x)", "__import__('sys').exit(5)")
INTERRUPTS_IN_FORWARD = TINY.replace("return self.fc(x)", "raise KeyboardInterrupt")
OWN_BASE_EXCEPTION = """
    from torch import nn

    class Stop(BaseException):
        pass

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            raise Stop("not today")
"""
RETURNS_NONE = TINY.replace("return self.fc(x)", "x.mul_(2)")
SLEEPS_AT_IMPORT = """
    import time
    time.sleep(600)
"""
WARNS = """
    import warnings
    import torch
    from torch import nn

    warnings.warn("this model is deprecated")

    class Warns(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.nn.functional.softmax(self.fc(x))  # torch warns: implicit dim

    example_inputs = (torch.randn(2, 8),)
"""


@pytest.fixture
def models(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name, source in (("tiny.py", TINY), ("fails.py", FAILS), ("nan_out.py", NAN_OUTPUT), ("gen.py", GENERATOR),
                         ("exits.py", EXITS_IN_FORWARD), ("interrupts.py", INTERRUPTS_IN_FORWARD),
                         ("sleeps.py", SLEEPS_AT_IMPORT), ("warns.py", WARNS), ("stop.py", OWN_BASE_EXCEPTION),
                         ("returns_none.py", RETURNS_NONE)):
        (tmp_path / name).write_text(textwrap.dedent(source))
    (tmp_path / "adir").mkdir()

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "evil.pt").write_bytes(pickle.dumps(Evil(), protocol=2))
    (tmp_path / "huge.json").write_text(json.dumps({"format": "preclint-baseline", "version": 1, "findings": [
        {"path": "tiny.py", "code": "PCL001", "fingerprint": "0", "count": 1e999}]}).replace("Infinity", "1e999"))
    (tmp_path / "glob.toml").write_text("exclude = ['[z-a]']\n")
    return tmp_path


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


MISTAKES = [
    (["tiny.py:Tiny", "--input-shape", "1,3,100000,100000"], "more than this machine's memory"),
    (["tiny.py:Tiny", "--input-shape", "1,3,100000,100000", "--no-run"], "more than this machine's memory"),
    (["tiny.py:Tiny", "--input-shape", "1,99999999999999999999"], "larger than a tensor can be"),
    (["tiny.py:Tiny", "--input-shape", "2,8", "--input-dtype", "float8_e4m3fn"], "float8_e4m3fn cannot be used"),
    (["tiny.py:Tiny", "--input-shape", "2,8", "--input-dtype", "qint8"], "qint8 cannot be used"),
    (["tiny.py:Tiny", "--input-shape", "2,8", "--input-shape", "2,8"],
     "Tiny.forward() does not take the example inputs (2x8 float32, 2x8 float32): too many positional"),
    (["tiny.py", "--weights", "evil.pt"], "(Trying to load unsupported GLOBAL posix.system whose module posix is blocked.)"),
    (["tiny.py:Tiny", "--input-shape", "2,8", "--input-dtype", "uint64"], "uint64 cannot be used"),
    (["gen.py"], "forward returned a generator"),
    (["stop.py"], "stop.py: the model's code raised Stop: not today at stop.py:10"),
    (["exits.py"], "exits.py: the model's code called sys.exit(5) at exits.py:11"),
    (["interrupts.py"], "raised KeyboardInterrupt at interrupts.py:11"),
    (["sleeps.py", "--timeout", "0.5"], "sleeps.py: gave up after 0.5 s, at sleeps.py:3"),
    (["tiny.py", "--rtol", "nan"], "rtol must be a finite number"),
    (["tiny.py", "--precision", ",,,"], "precisions names no precision"),
    (["tiny.py", "--select", ""], "select names no rule"),
    (["tiny.py", "--seed", str(2 ** 70)], "argument --seed"),
    (["tiny.py", "--timeout", "-1"], "argument --timeout"),
    (["tiny.py", "--write-baseline", "adir"], "adir: is a directory"),
    (["tiny.py", "--write-baseline", "tiny.py"], "tiny.py: is code preclint checks, not a baseline"),
    (["tiny.py", "--baseline", "huge.json"], "baseline record 1 has count inf"),
    (["tiny.py", "--config", "glob.toml"], "invalid glob '[z-a]'"),
    (["adir"], "is a directory"),
]


@pytest.mark.slow
@pytest.mark.parametrize("argv, needle", MISTAKES, ids=[" ".join(a) for a, _ in MISTAKES])
def test_a_mistake_is_one_line_and_exit_2(models, capsys, argv, needle):
    code, out, err = run(capsys, "check", *argv, "--output-format", "concise")
    assert code == 2, err
    assert out == "" and err.count("\n") == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert needle in err, err


def test_an_fp32_output_that_is_nan_predicts_no_error(models, capsys):
    code, out, err = run(capsys, "check", "nan_out.py", "--output-format", "json")
    doc = json.loads(out)
    assert code == 1 and [f["code"] for f in doc["findings"]] == ["PCL002"]
    for entry in doc["summary"].values():
        assert entry["predicted_output"] == {"rel_error": None, "max_abs_error": None, "finite": False}


def test_a_model_that_returns_no_tensor_is_checked_with_a_note(models, capsys):
    # its intermediate values can still overflow; what is missing is an output to compare, and the report says so
    code, out, err = run(capsys, "check", "returns_none.py", "--output-format", "json")
    doc = json.loads(out)
    assert code in (0, 1), err
    assert any("returns None and no tensor" in note for note in doc["notes"]), doc["notes"]


@pytest.mark.slow
def test_a_failing_model_is_in_every_document_and_the_others_are_kept(models, capsys):
    code, out, err = run(capsys, "check", "tiny.py", "fails.py", "--output-format", "json")
    assert code == 2 and err.count("\n") == 1 and "this model always fails" in err
    tiny, fails = json.loads(out)
    assert tiny["model"] == "tiny.py:Tiny" and "error" not in tiny
    assert fails["model"] == "fails.py" and "this model always fails" in fails["error"] and fails["findings"] == []

    code, out, _ = run(capsys, "check", "tiny.py", "fails.py", "--output-format", "sarif")
    sarif = json.loads(out)
    jsonschema.validate(sarif, SARIF_SCHEMA)
    (run_,) = sarif["runs"]
    (invocation,) = run_["invocations"]
    assert code == 2 and invocation["executionSuccessful"] is False
    assert "this model always fails" in invocation["toolExecutionNotifications"][0]["message"]["text"]

    code, out, _ = run(capsys, "check", "tiny.py", "tiny.py", "--output-format", "rdjson")
    assert code == 0 and json.loads(out)["diagnostics"] == []  # one document, not two

    code, out, _ = run(capsys, "check", "fails.py", "--output-format", "github")
    assert code == 2 and out.startswith("::error title=preclint::preclint could not check fails.py")

    code, out, _ = run(capsys, "check", "tiny.py", "fails.py", "--output-format", "concise")
    assert out == "1 model could not be checked: fails.py.\n"


def test_no_baseline_is_written_when_a_model_could_not_be_checked(models, capsys):
    baseline = models / "baseline.json"
    baseline.write_text("the user's file")
    code, out, err = run(capsys, "check", "tiny.py", "fails.py", "--write-baseline", "baseline.json")
    assert code == 2 and baseline.read_text() == "the user's file"
    assert "baseline.json was left as it was" in err


def test_the_baseline_never_lands_on_the_report_or_the_code(models, capfd):
    """stdout is the report's: `--write-baseline /dev/stdout` (or the file stdout is redirected to) would
    mix two documents; a checked file would lose the user's code."""
    (models / "notes.txt").write_text("mine")
    for target in ("/dev/stdout", "-", "tiny.py"):
        assert main(["check", "--source-only", "tiny.py", "--write-baseline", target]) == 2
        out, err = capfd.readouterr()
        assert out == "" and err.count("\n") == 1 and "baseline" in err, (target, err)
    assert (models / "tiny.py").read_text() == textwrap.dedent(TINY)
    assert main(["check", "--source-only", "notes.txt", "--write-baseline", "notes.txt"]) == 2
    assert (models / "notes.txt").read_text() == "mine"


def test_warnings_are_kept_off_stderr_and_the_models_own_become_notes(models, capsys):
    code, out, err = run(capsys, "check", "warns.py", "--output-format", "json")
    assert code == 0 and err == ""
    notes = [n for n in json.loads(out)["notes"] if not n.startswith("tf32 assumes")]  # (predict/kernel_cases.py)
    assert notes == ["warning at warns.py:6: UserWarning: this model is deprecated"]
    code, out, err = run(capsys, "check", "warns.py", "--output-format", "json", "--debug")
    assert "preclint: debug: warning: warns.py:6" in err and "Implicit dimension choice for softmax" in err


# ------------------------------------------------------------------------------------ baseline files


def test_a_fifo_is_written_to_not_replaced(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(UserError, match="no process is reading the FIFO"):
        write_output_file(str(fifo), "{}\n", "baseline")
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    for _ in range(200):  # until the reader has opened its end
        try:
            write_output_file(str(fifo), "{}\n", "baseline")
            break
        except UserError:
            threading.Event().wait(0.01)
    reader.join(10)
    assert received == ["{}\n"] and stat.S_ISFIFO(os.lstat(fifo).st_mode)


@pytest.mark.skipif(os.geteuid() != 0, reason="making device nodes needs root")
def test_a_device_is_written_to_not_replaced(tmp_path):
    full, null = tmp_path / "full", tmp_path / "null"
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    with pytest.raises(UserError, match="full: cannot write the baseline: No space left on device"):
        write_output_file(str(full), "{}\n", "baseline")
    write_output_file(str(null), "{}\n", "baseline")
    assert stat.S_ISCHR(os.lstat(full).st_mode) and stat.S_ISCHR(os.lstat(null).st_mode)


def test_a_regular_file_keeps_mode_and_owner_and_a_link_to_one_is_refused(tmp_path):
    """A link is never written through: a checkout can commit `baseline.json -> ~/.bashrc`."""
    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o640)
    if os.geteuid() == 0:
        os.chown(real, 1234, 1234)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    with pytest.raises(UserError, match="link.json: is a symbolic link; preclint does not write the baseline"):
        write_output_file(str(link), "new", "baseline")
    assert link.is_symlink() and real.read_text() == "old"
    write_output_file(str(real), "new", "baseline")
    info = os.stat(real)
    assert real.read_text() == "new" and stat.S_IMODE(info.st_mode) == 0o640
    if os.geteuid() == 0:
        assert (info.st_uid, info.st_gid) == (1234, 1234)
    write_output_file(str(tmp_path / "new.json"), "created", "baseline")
    assert (tmp_path / "new.json").read_text() == "created"


@pytest.mark.parametrize(
    "records, message",
    [
        ('[{"path": "a.py", "code": "PCL501", "fingerprint": "f", "count": -3}]', "count -3"),
        ('[{"path": "a.py", "code": "PCL501", "fingerprint": "f", "count": 2.5}]', "count 2.5"),
        ('[{"path": "a.py", "code": "PCL501", "fingerprint": "f", "count": true}]', "count True"),
        ('[{"path": "a.py", "code": "PCL501"}]', "lacks path, code or fingerprint"),
        ('[{"path": 1, "code": "PCL501", "fingerprint": "f"}]', "lacks path, code or fingerprint"),
        ('{"a.py": 1}', "findings are not a list"),
    ],
)
def test_a_baseline_record_preclint_cannot_use_is_a_user_error(tmp_path, records, message):
    path = tmp_path / "baseline.json"
    path.write_text('{"format": "preclint-baseline", "version": 1, "findings": %s}' % records)
    with pytest.raises(UserError, match="baseline") as caught:
        read_baseline(str(path))
    assert message in str(caught.value)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_baseline_aimed_at_the_redirected_stdout_is_refused(models):
    """`preclint check ... --write-baseline report.txt > report.txt`, and /dev/stdout into a file: the
    report file keeps the report alone (nothing, as the run stops at once), never a baseline in it."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for target in ("report.txt", "/dev/stdout"):
        with open(models / "report.txt", "w") as report:
            proc = subprocess.run([sys.executable, "-m", "preclint", "check", "--source-only", "tiny.py",
                                   "--write-baseline", target], cwd=models, env=env, stdout=report,
                                  stderr=subprocess.PIPE, text=True, timeout=120)
        assert proc.returncode == 2 and "is where the report goes (stdout)" in proc.stderr, proc.stderr
        assert (models / "report.txt").read_text() == ""


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize(
    "shell, code, message",
    [
        ("python -m preclint rule PCL101 > /dev/full", 2, "preclint: error: cannot print the report on stdout: No space left on device\n"),
        ("python -m preclint rule PCL101 >&-", 2, "preclint: error: stdout is closed: there is nowhere to print the report\n"),
        ("python -m preclint rule --all | true", 141, ""),  # the reader left: quietly, as SIGPIPE would
        ("mkdir gone && cd gone && rmdir ../gone && python -m preclint rule PCL101", 2,
         "preclint: error: the working directory no longer exists; cd to one that does\n"),
    ],
)
def test_a_stdout_or_working_directory_that_cannot_serve_is_one_line(tmp_path, shell, code, message):
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=str(ROOT))
    shell = shell.replace("python", sys.executable)
    if "| true" in shell:  # the exit status of preclint, not of `true`; `true` may exit before preclint writes
        shell = f"set -o pipefail; {shell.replace('| true', '| (exec 0<&-)')}"
    proc = subprocess.run(["bash", "-c", shell], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (code, message)
