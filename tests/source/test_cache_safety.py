"""The source cache against whoever else can write where it lives (a shared PRECLINT_CACHE_DIR, a CI
cache restored from another branch): nothing planted there is written through, read without end or
believed, and the findings stay what the files hold."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import stat
import subprocess
import sys

import pytest

from tests.source.test_source_cli import AMP
from tests.paths import ROOT

FINDING = "pkg/m.py:3:6: PCL502 [*] `torch.cuda.amp.autocast` is deprecated"


def preclint(project, *args, timeout=120):
    """`preclint check --source-only --output-format concise ... pkg` in a child process (a hang fails
    the test, not the test run), with the project's PRECLINT_CACHE_DIR."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "preclint", "check", "--source-only", "--output-format", "concise", *args, "pkg"],
        cwd=project, capture_output=True, text=True, timeout=timeout, env=env,
    )


def warmed(project) -> pathlib.Path:
    """The cache file of a first run over pkg/m.py (which has one finding)."""
    (project / "pkg" / "m.py").write_text(AMP)
    done = preclint(project)
    assert done.returncode == 1 and FINDING in done.stdout, done.stderr
    (cache_file,) = glob.glob(str(project / "cache" / "v*" / "*" / "*.json"))
    return pathlib.Path(cache_file)


def assert_findings_correct(done) -> None:
    assert done.returncode == 1, done.stderr
    assert done.stdout.splitlines()[0].startswith(FINDING) and "Found 1 finding." in done.stdout
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr


# ---------------------------------------------------------------------------- files planted in the cache

def _link_to_users_file(project, cache_file):
    cache_file.symlink_to(project / "users_file.txt")


def _link_to_dev_zero(project, cache_file):
    # root gets a zero device of its own: code that wrote through the link as root would replace the
    # node it names (main did, with /dev/zero), and that must not be the machine's
    zero = "/dev/zero"
    if os.geteuid() == 0:
        zero = str(project / "zero")
        try:
            os.mknod(zero, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
        except PermissionError:  # a container without CAP_MKNOD
            pytest.skip("cannot make a device node here")
    cache_file.symlink_to(zero)
    project.joinpath("zero-device").write_text(zero)


def _fifo(project, cache_file):
    os.mkfifo(cache_file)


PLANTED = {"a link to the user's file": _link_to_users_file, "a link to /dev/zero": _link_to_dev_zero,
           "a FIFO": _fifo}


@pytest.mark.slow
@pytest.mark.parametrize("plant", PLANTED.values(), ids=list(PLANTED))
def test_what_is_planted_where_the_cache_file_lives_is_refused_not_written_through(project, plant):
    users_file = project / "users_file.txt"
    users_file.write_text("the user's own file\n")
    cache_file = warmed(project)
    cache_file.unlink()
    plant(project, cache_file)
    (project / "pkg" / "m.py").write_text(AMP + "\n")  # changed: the run has a new entry to write
    done = preclint(project, timeout=60)
    assert_findings_correct(done)
    assert users_file.read_text() == "the user's own file\n"
    assert cache_file.is_symlink() or stat.S_ISFIFO(os.lstat(cache_file).st_mode)  # left as planted
    zero = project / "zero-device"
    assert not zero.exists() or stat.S_ISCHR(os.stat(zero.read_text()).st_mode)
    (note,) = [line for line in done.stderr.splitlines() if line.startswith("warning: cache:")]
    assert str(cache_file) in note and "the cache is not used in this run" in note


@pytest.mark.slow
def test_a_link_planted_for_a_cache_directory_is_refused(project):
    cache_file = warmed(project)
    elsewhere = project / "users_directory"
    elsewhere.mkdir()
    version = cache_file.parent.parent  # cache/v3
    os.rename(version, project / "old")
    version.symlink_to(elsewhere)
    (project / "pkg" / "m.py").write_text(AMP + "\n")
    done = preclint(project)
    assert_findings_correct(done)
    assert os.listdir(elsewhere) == []  # nothing written into the directory the link names
    assert f"warning: cache: {version}: a symbolic link" in done.stderr


@pytest.mark.slow
def test_a_hard_link_to_the_users_file_is_not_written_into(project):
    """A hard link passes as a regular file of this user: it is read (and is no cache), then
    replaced by a new file; the inode it shares with the user's file is never written."""
    users_file = project / "users_file.txt"
    users_file.write_text("the user's own file\n")
    cache_file = warmed(project)
    cache_file.unlink()
    os.link(users_file, cache_file)
    done = preclint(project)
    assert_findings_correct(done)
    assert users_file.read_text() == "the user's own file\n"
    assert "does not hold what preclint writes (not a preclint cache" in done.stderr
    assert preclint(project).stderr == ""  # rewritten: the next run trusts it


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="giving files away needs root")
def test_a_cache_file_or_directory_of_another_user_is_refused(project):
    cache_file = warmed(project)
    os.chown(cache_file, 12345, 12345)
    done = preclint(project)
    assert_findings_correct(done)
    assert "owned by another user (uid 12345)" in done.stderr and os.stat(cache_file).st_uid == 12345
    os.chown(cache_file, 0, 0)
    os.chown(cache_file.parent, 12345, 12345)
    done = preclint(project)
    assert_findings_correct(done)
    assert f"warning: cache: {cache_file.parent}: owned by another user (uid 12345)" in done.stderr


# ---------------------------------------------------------------------------- entries edited by hand

def _rewrite(cache_file, edit, checksum=True):
    """Apply ``edit`` to the cache's entries; with ``checksum``, as a forger who recomputes it would."""
    from preclint.source.cache import encode_document

    doc = json.loads(cache_file.read_text())
    (entry,) = doc["files"].values()
    edit(entry)
    if checksum:
        cache_file.write_bytes(encode_document(doc["settings"], doc["files"]))
    else:
        cache_file.write_text(json.dumps(doc, separators=(",", ":")))


def _set(index, value):
    def edit(entry):
        entry[2][0][index] = value
    return edit


def _findings(value):
    def edit(entry):
        entry[2] = value
    return edit


TAMPERED = {
    "a bogus severity": (_set(2, "bogus"), "a finding of the severity 'bogus'"),
    "an unknown code": (_set(0, "PCL999"), "a finding of the code 'PCL999'"),
    "a code under another name": (_set(1, "no-such-rule"), "named 'no-such-rule'"),
    "a line that is text": (_set(5, "3"), "line, column or fixable flag"),
    "a line that is a bool": (_set(5, True), "line, column or fixable flag"),
    "an unknown precision": (_set(7, ["fp4"]), "precisions ['fp4']"),
    "a finding of 8 fields": (lambda entry: entry[2][0].pop(), "not a record of 9 fields"),
    "a digest that is no digest": (lambda entry: entry.__setitem__(1, "x"), "printed path, digest"),
}


@pytest.mark.slow
@pytest.mark.parametrize("edit, reason", TAMPERED.values(), ids=list(TAMPERED))
def test_a_tampered_entry_is_ignored_not_trusted(project, edit, reason):
    cache_file = warmed(project)
    _rewrite(cache_file, edit)
    done = preclint(project)
    assert_findings_correct(done)
    (note,) = done.stderr.splitlines()
    assert "does not hold what preclint writes (" in note and reason in note, note
    assert preclint(project).stderr == ""  # rewritten as preclint writes it


@pytest.mark.slow
def test_findings_hidden_or_invented_by_hand_are_not_believed(project):
    cache_file = warmed(project)
    _rewrite(cache_file, _findings([]), checksum=False)  # "this file is clean"
    done = preclint(project)
    assert_findings_correct(done)
    assert "do not match its checksum" in done.stderr
    invented = ["PCL502", "deprecated-amp-api", "warning", "invented", "", 1, 1, ["fp16"], True]
    _rewrite(cache_file, lambda entry: entry[2].append(invented), checksum=False)
    assert_findings_correct(preclint(project))


@pytest.mark.slow
def test_an_entry_that_points_outside_its_file_is_checked_again(project):
    """Well-formed, checksum recomputed, yet line 4000 of a 4-line file: not what preclint wrote."""
    cache_file = warmed(project)
    _rewrite(cache_file, _set(5, 4000))
    done = preclint(project)
    assert_findings_correct(done)
    assert "1 entry in" in done.stderr and "point outside their files" in done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"format": 3, "files": {"x": [1, 2'],
                         ids=["deeply nested", "truncated"])
def test_a_cache_file_that_is_no_cache_counts_as_empty(project, text):
    cache_file = warmed(project)
    cache_file.write_text(text)
    done = preclint(project)
    assert_findings_correct(done)
    assert "does not hold what preclint writes" in done.stderr and done.stderr.count("\n") == 1


@pytest.mark.slow
def test_a_normal_run_has_nothing_to_say_about_its_cache(project):
    warmed(project)
    done = preclint(project)
    assert_findings_correct(done)
    assert done.stderr == ""
    from preclint.config import Config
    from preclint.source.run import check_paths

    os.environ["PRECLINT_CACHE_DIR"] = str(project / "cache")
    assert check_paths(["pkg"], Config()).cached == 1  # the warm run was answered by the cache
