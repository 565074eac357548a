"""What preclint reads is bounded and what it writes is safe, as a CI run on an untrusted pull request
meets them: a baseline or configuration that is a FIFO, a link to /dev/zero or deeply nested JSON ends
in one line and exit 2 at once; `-o` never replaces another input of the run, nor writes through a
link; `--fix` goes through every file and says which it changed and which it could not."""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shutil
import stat
import subprocess
import sys
import time

import pytest

from tests.source.test_source_cli import AMP, TF32
from tests.paths import ROOT



def preclint(project, *args, timeout=60):
    """`preclint check --source-only --output-format concise ...` in a child process: a hang fails
    the test (``timeout``), not the test run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "preclint", "check", "--source-only", "--output-format", "concise", *args],
        cwd=project, capture_output=True, text=True, timeout=timeout, env=env,
    )


def one_error(done, *words) -> None:
    """Exit 2 with one line on stderr, holding ``words``, and no report."""
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("preclint: error: "), done.stderr
    assert all(word in done.stderr for word in words), done.stderr
    assert done.stdout == ""


# ---------------------------------------------------------------------------- reading: bounded, no hang

@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_as_the_baseline_exits_2_at_once(project):
    (project / "pkg" / "m.py").write_text(AMP)
    os.mkfifo(project / "baseline.json")
    started = time.monotonic()
    done = preclint(project, "--baseline", "baseline.json", "pkg", timeout=60)
    one_error(done, "baseline.json: cannot read the baseline: not a regular file")
    assert time.monotonic() - started < 30  # the time of a start, not of a wait on the FIFO


@pytest.mark.slow
def test_a_baseline_linked_to_dev_zero_is_refused_without_reading_it(project):
    """git can commit `baseline.json -> /dev/zero`: read, it grows memory until MemoryError."""
    (project / "pkg" / "m.py").write_text(AMP)
    (project / "baseline.json").symlink_to("/dev/zero")
    one_error(preclint(project, "--baseline", "baseline.json", "pkg"), "not a regular file")


@pytest.mark.slow
def test_a_deeply_nested_or_huge_baseline_is_one_line(project):
    (project / "pkg" / "m.py").write_text(AMP)
    (project / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    one_error(preclint(project, "--baseline", "deep.json", "pkg"),
              "deep.json: not a preclint baseline", "nested 100000 levels deep, more than the limit of 32")
    with open(project / "huge.json", "wb") as huge:  # sparse: no disk is used
        huge.truncate(65 << 20)
    one_error(preclint(project, "--baseline", "huge.json", "pkg"), "huge.json: cannot read the baseline: larger than 64 MiB")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_configuration_that_is_a_fifo_a_device_or_too_deep_is_one_line(project):
    (project / "pkg" / "m.py").write_text(AMP)
    os.mkfifo(project / "fifo.toml")
    one_error(preclint(project, "--config", "fifo.toml", "pkg"), "fifo.toml: cannot read the configuration: not a regular file")
    (project / "zero.toml").symlink_to("/dev/zero")
    one_error(preclint(project, "--config", "zero.toml", "pkg"), "zero.toml: cannot read the configuration")
    (project / "pyproject.toml").write_text("[tool.preclint]\nselect = " + "[" * 5000 + "]" * 5000 + "\n")
    one_error(preclint(project, "pkg"), "pyproject.toml: invalid TOML: its arrays or tables nest too deeply")


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_policy_that_is_a_fifo_or_too_deep_is_a_policy_error_at_once(tmp_path):
    os.mkfifo(tmp_path / "plan.json")
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    code = ("from preclint.policy import PolicyError, load_policy\n"
            "for name in ('plan.json', 'deep.json'):\n"
            "    try:\n"
            "        load_policy(name)\n"
            "    except PolicyError as exc:\n"
            "        print(exc)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stdout.splitlines() == [
        "cannot read the policy plan.json: not a regular file",
        "deep.json is not a JSON plan: nested 100000 levels deep, more than the limit of 32",
    ], done.stderr


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_model_file_or_weights_file_that_is_a_fifo_exits_2_at_once(project):
    (project / "model.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nexample_inputs = torch.ones(1, 2)\n")
    os.mkfifo(project / "weights.pt")
    os.mkfifo(project / "fifo.py")
    for args, message in ((["model.py", "--weights", "weights.pt"], "weights.pt: not a regular file, expected a weights file"),
                          (["fifo.py"], "fifo.py: not a regular file")):
        done = subprocess.run([sys.executable, "-m", "preclint", "check", *args], cwd=project, capture_output=True,
                              text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
        one_error(done, message)


# ---------------------------------------------------------------------------- -o and --write-baseline

@pytest.mark.slow
def test_the_report_never_replaces_an_input_of_the_same_run(project):
    (project / "pkg" / "m.py").write_text(AMP)
    assert preclint(project, "--write-baseline", "baseline.json", "pkg").returncode == 0
    baseline = (project / "baseline.json").read_bytes()
    os.link(project / "baseline.json", project / "same-inode.json")
    for target in ("baseline.json", "same-inode.json", "./pkg/../baseline.json"):
        one_error(preclint(project, "--baseline", "baseline.json", "-o", target, "pkg"),
                  f"{target}: is the baseline this run reads (--baseline); write the report to another file")
    assert (project / "baseline.json").read_bytes() == baseline
    one_error(preclint(project, "--write-baseline", "new.json", "-o", "new.json", "pkg"),
              "new.json: is where this run writes its baseline (--write-baseline)")
    assert not (project / "new.json").exists()
    config = "[tool.preclint]\nselect = [\"PCL5\"]\n"
    (project / "pyproject.toml").write_text(config)
    for flag in ("-o", "--write-baseline"):
        one_error(preclint(project, flag, "pyproject.toml", "pkg"), "pyproject.toml: is the configuration this run reads")
    assert (project / "pyproject.toml").read_text() == config


@pytest.mark.slow
def test_the_report_for_a_graph_check_never_replaces_its_weights_file(project):
    (project / "model.py").write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nexample_inputs = torch.ones(1, 2)\n")
    (project / "weights.pt").write_bytes(b"the user's weights")
    done = subprocess.run([sys.executable, "-m", "preclint", "check", "model.py", "--weights", "weights.pt",
                           "-o", "weights.pt"], cwd=project, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    one_error(done, "weights.pt: is the weights file this run loads (--weights)")
    assert (project / "weights.pt").read_bytes() == b"the user's weights"


@pytest.mark.slow
def test_outputs_are_never_written_through_a_link_a_checkout_can_hold(project):
    """A pull request commits `report.sarif -> ~/.bashrc`; CI runs `preclint ... -o report.sarif`."""
    (project / "pkg" / "m.py").write_text(AMP)
    (project / "home").mkdir()
    bashrc = project / "home" / ".bashrc"
    bashrc.write_text("export PATH=/usr/bin\n")
    (project / "report.sarif").symlink_to(bashrc)
    (project / "baseline.json").symlink_to(bashrc)
    one_error(preclint(project, "-o", "report.sarif", "pkg"), "report.sarif: is a symbolic link; preclint does not write")
    one_error(preclint(project, "--write-baseline", "baseline.json", "pkg"), "baseline.json: is a symbolic link")
    assert bashrc.read_text() == "export PATH=/usr/bin\n"
    # streams a user names are still written to: the null device, and a link to it
    (project / "null").symlink_to(os.devnull)
    for target in (os.devnull, "null"):
        done = preclint(project, "-o", target, "pkg")
        assert done.returncode == 1 and done.stdout == "" and done.stderr == "", done.stderr
    assert (project / "null").is_symlink()


@pytest.mark.slow
@pytest.mark.subprocess
def test_no_output_goes_through_a_linked_directory_on_the_way(project):
    """A pull request commits `reports -> <outside>`; CI runs `-o reports/x.sarif`, `--write-baseline
    reports/b.json`, `--fix dir_link/x.py`: each is one line and exit 2, and nothing outside changes."""
    (project / "pkg" / "m.py").write_text(AMP)
    outside = project / "home" / "outside"
    (outside / "deeper").mkdir(parents=True)
    for name in ("x.sarif", "b.json", "deeper/x.sarif"):
        (outside / name).write_text("precious\n")
    (outside / "x.py").write_text(AMP)
    for link in ("reports", "dir_link", "pkg/nested"):
        (project / link).symlink_to(outside)
    for target, link in (("reports/x.sarif", "reports"), ("pkg/nested/deeper/x.sarif", "pkg/nested"),
                         ("pkg/../reports/x.sarif", "pkg/../reports"),
                         (str(project / "reports" / "x.sarif"), str(project / "reports"))):
        one_error(preclint(project, "-o", target, "pkg"), f"{target}: {link} is a symbolic link; preclint does "
                  "not write the report through links")
    one_error(preclint(project, "--write-baseline", "reports/b.json", "pkg"),
              "reports/b.json: reports is a symbolic link; preclint does not write the baseline through links")
    fixed = preclint(project, "--fix", "dir_link/x.py")
    assert fixed.returncode == 2, fixed.stderr
    assert ("preclint: error: dir_link/x.py: not fixed: dir_link is a symbolic link, and preclint does not "
            "write through links") in fixed.stderr
    assert (outside / "x.py").read_text() == AMP
    assert all((outside / name).read_text() == "precious\n" for name in ("x.sarif", "b.json", "deeper/x.sarif"))
    assert sorted(p.name for p in outside.iterdir()) == ["b.json", "deeper", "x.py", "x.sarif"]  # no temporary left
    # a real directory on the way is written to, relative or absolute
    (project / "out").mkdir()
    for target in ("out/x.sarif", str(project / "out" / "y.sarif")):
        assert preclint(project, "-o", target, "pkg").returncode == 1
    assert sorted(p.name for p in (project / "out").iterdir()) == ["x.sarif", "y.sarif"]


def test_a_directory_swapped_for_a_link_after_the_checks_is_not_written_through(project):
    """The write itself opens the way again: the check before the run is not what keeps it out."""
    from preclint.core.errors import UserError
    from preclint.report.output import check_output_target, write_output_file

    outside = project / "home"
    outside.mkdir()
    (project / "reports").mkdir()
    check_output_target("reports/x.sarif", "report")
    (project / "reports").rmdir()
    (project / "reports").symlink_to(outside)
    with pytest.raises(UserError, match="reports/x.sarif: reports is a symbolic link"):
        write_output_file("reports/x.sarif", "{}", "report")
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------------------- --fix

@contextlib.contextmanager
def unwritable(path: pathlib.Path):
    """``path`` made a file its owner cannot write: read-only, or immutable for root (who writes
    read-only files); skips where neither can be had."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        yield
        path.chmod(0o644)
        return
    if shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode:
        pytest.skip("root writes read-only files, and chattr +i is not available here")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


@pytest.mark.slow
def test_fix_goes_through_every_file_and_says_which_it_changed(project):
    for name in ("a.py", "b.py", "c.py"):
        (project / "pkg" / name).write_text(AMP)
    (project / "pkg" / "c.py").chmod(0o640)
    with unwritable(project / "pkg" / "b.py"):
        done = preclint(project, "--no-cache", "--fix", "pkg")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert lines[0] == "Fixed 1 finding in pkg/a.py."
    assert lines[1].startswith("preclint: error: pkg/b.py: not fixed: cannot write it: ")
    assert lines[1].endswith("; the file is unchanged")
    assert lines[2:] == ["Fixed 1 finding in pkg/c.py.", "Fixed 2 findings."]
    assert (project / "pkg" / "b.py").read_text() == AMP  # untouched
    for name in ("a.py", "c.py"):
        assert 'torch.autocast("cuda", dtype=torch.float16)' in (project / "pkg" / name).read_text()
    assert stat.S_IMODE((project / "pkg" / "c.py").stat().st_mode) == 0o640
    assert sorted(os.listdir(project / "pkg")) == ["a.py", "b.py", "c.py"]  # no temporary file left
    assert done.stdout.splitlines() == [  # what is left: the finding in the file that could not be fixed
        "pkg/b.py:3:6: PCL502 [*] `torch.cuda.amp.autocast` is deprecated; use `torch.autocast(\"cuda\", ...)`.",
        "Found 1 finding.", "[*] 1 fixable with the `--fix` option."]


@pytest.mark.slow
def test_fix_in_a_json_report_keeps_stdout_the_report(project):
    (project / "pkg" / "a.py").write_text(AMP + TF32.replace("import torch\n", ""))
    done = subprocess.run([sys.executable, "-m", "preclint", "check", "--source-only", "--output-format", "json",
                           "--no-cache", "--fix", "pkg"], cwd=project, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.stderr.splitlines() == ["Fixed 1 finding in pkg/a.py.", "Fixed 1 finding."]
    assert [f["code"] for f in json.loads(done.stdout)["findings"]] == ["PCL504"]
