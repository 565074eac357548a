"""Every benchmark result says where it came from: commit, command, machine, date
(benchmarks/provenance.py, benchmarks/CLAIMS.md)."""
from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from benchmarks import provenance
from tests.paths import ROOT

BENCHMARKS = ROOT / "benchmarks"


def git(repo: pathlib.Path, *args: str) -> str:
    # a repository of the test's own: no hooks, no signing, whatever the global configuration says
    return subprocess.run(["git", "-c", "core.hooksPath=/dev/null", "-c", "commit.gpgsign=false",
                           "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path):
    if subprocess.run(["git", "--version"], capture_output=True).returncode != 0:
        pytest.skip("git is not installed")
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "old.json").write_text("{}\n")
    git(tmp_path, "add", "code.py", "benchmarks/results/old.json")
    git(tmp_path, "commit", "-q", "-m", "first")
    return tmp_path


@pytest.mark.subprocess
def test_a_clean_checkout_records_its_head(repo):
    assert provenance.provenance(repo)["commit"] == git(repo, "rev-parse", "HEAD")


@pytest.mark.subprocess
def test_a_changed_or_new_file_marks_the_commit_dirty(repo):
    head = git(repo, "rev-parse", "HEAD")
    (repo / "new_benchmark.py").write_text("y = 2\n")
    assert provenance.provenance(repo)["commit"] == head + "-dirty"
    (repo / "new_benchmark.py").unlink()
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.provenance(repo)["commit"] == head + "-dirty"


@pytest.mark.subprocess
def test_results_being_written_do_not_make_the_code_dirty(repo):
    (repo / "benchmarks" / "results" / "old.json").write_text('{"rewritten": true}\n')
    (repo / "benchmarks" / "results" / "new.json").write_text("{}\n")
    assert provenance.provenance(repo)["commit"] == git(repo, "rev-parse", "HEAD")


def test_without_a_repository_the_commit_comes_from_the_launcher_or_is_none(repo, tmp_path_factory, monkeypatch):
    bare_copy = tmp_path_factory.mktemp("copy")  # a copy of the tree on a GPU machine: no .git
    monkeypatch.delenv(provenance.COMMIT_VARIABLE, raising=False)
    assert provenance.provenance(bare_copy)["commit"] is None
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "abc1234")
    record = provenance.provenance(bare_copy)
    assert record["commit"] == "abc1234" and provenance.COMMIT_VARIABLE in record["commit_from"]
    # a folder inside some other repository is not that repository's checkout
    nested = repo / "benchmarks" / "copy"
    nested.mkdir()
    assert provenance.provenance(nested)["commit"] == "abc1234"


@pytest.mark.subprocess
def test_a_run_records_the_tree_as_it_began_not_as_edited_while_it_ran(repo):
    """A benchmark writes its result at the end; a file edited meanwhile is no part of what measured."""
    (repo / "benchmarks" / "provenance.py").write_text((BENCHMARKS / "provenance.py").read_text())
    git(repo, "add", "benchmarks/provenance.py")
    git(repo, "commit", "-q", "-m", "helper")
    run = ("import pathlib, sys; sys.path.insert(0, 'benchmarks'); import provenance; "
           "pathlib.Path('edited_while_running.py').write_text('z = 3'); print(provenance.stamp({})['provenance']['commit'])")
    printed = subprocess.run([sys.executable, "-c", run], cwd=repo, capture_output=True, text=True, check=True).stdout
    assert printed.strip() == git(repo, "rev-parse", "HEAD")


def test_the_record_holds_command_machine_and_a_utc_date():
    record = provenance.provenance(ROOT)
    assert set(record) >= {"commit", "command", "machine", "date"}
    assert "pytest" in record["command"]
    assert {"platform", "python", "cpu_count", "torch"} <= set(record["machine"])
    assert datetime.datetime.fromisoformat(record["date"]).utcoffset() == datetime.timedelta(0)


def test_stamp_puts_the_run_first_and_replaces_an_earlier_one():
    stamped = provenance.stamp({"provenance": {"commit": "old"}, "figure": 1.5})
    assert list(stamped) == ["provenance", "figure"]
    assert stamped["provenance"] == provenance.run_provenance() and stamped["figure"] == 1.5


def entry_points():
    """The commands a user runs: ``python benchmarks/NAME.py`` and ``python -m benchmarks.PACKAGE``
    (a package's other modules, such as the fuzz workers' loop, write no result of their own)."""
    scripts = [p for p in BENCHMARKS.glob("*.py") if '__name__ == "__main__"' in p.read_text(encoding="utf-8")]
    return sorted(scripts + list(BENCHMARKS.glob("*/__main__.py")))


@pytest.mark.parametrize("script", entry_points(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_benchmark_that_writes_json_stamps_it(script):
    text = script.read_text(encoding="utf-8")
    if re.search(r"json\.dumps?\(", text):
        assert "benchmarks.provenance import" in text, f"{script.name} writes results without their provenance"


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_merged_measurement_keeps_the_provenance_of_the_runs_it_merges(tmp_path):
    for name, commit in (("a.json", "aaa"), ("b.json", "bbb")):
        (tmp_path / name).write_text(json.dumps({"provenance": {"commit": commit}, "machine": {}, "models": {name: {}}}))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, str(BENCHMARKS / "accuracy.py"), "merge", "merged.json", "a.json", "b.json"],
                   cwd=tmp_path, env=env, check=True, capture_output=True, timeout=300)
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert [run["commit"] for run in merged["merged_runs"]] == ["aaa", "bbb"]
    assert "accuracy.py merge merged.json a.json b.json" in merged["provenance"]["command"]
    assert set(merged["models"]) == {"a.json", "b.json"}


def test_the_launchers_commit_wins_over_a_repository_the_copy_carries(repo, monkeypatch):
    """The GPU machine's copy of the tree held a repository at the session's first commit: git there
    named a commit the copy was not made from."""
    monkeypatch.setenv(provenance.COMMIT_VARIABLE, "c789b36")
    record = provenance.provenance(repo)
    assert record["commit"] == "c789b36" and provenance.COMMIT_VARIABLE in record["commit_from"]
