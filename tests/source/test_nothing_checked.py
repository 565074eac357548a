"""A source-only run that read no file says so and exits 2, never "No findings." and 0: a named
directory the configuration excludes, ``exclude = ["*.py"]`` (a pull request can commit one), an empty
directory, a .gitignore that leaves out everything, a named FIFO. Files that a run named and that
``--force-exclude`` leaves out (pre-commit's hook naming an excluded staged file) were the
configuration's choice: that run says so in a note and passes, as Ruff's does."""
from __future__ import annotations

import os

import pytest

from preclint.cli import main

AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(AMP)
    return tmp_path


def run(capsys, *args):
    code = main(["check", "--source-only", *args])
    out, err = capsys.readouterr()
    return code, out, err


def _nothing_checked(code, out, err, shown):
    assert code == 2, (out, err)
    assert out == ""  # no "No findings.", no empty document that an upload step would take for a pass
    assert err.count("\n") == 1 and f"preclint: error: no Python file was checked under {shown}" in err, err


@pytest.mark.parametrize("fmt", ["full", "json", "sarif"])
def test_every_file_excluded_by_the_configuration_is_an_error(project, capsys, fmt):
    (project / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["*.py"]\n')
    _nothing_checked(*run(capsys, ".", "--output-format", fmt), ".")


def test_a_named_directory_the_configuration_excludes_is_an_error(project, capsys):
    (project / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["pkg"]\n')
    _nothing_checked(*run(capsys, "pkg"), "pkg")
    code, out, _ = run(capsys, "pkg/m.py")  # a file named is still checked, whatever exclude says
    assert code == 1 and "PCL502" in out


def test_an_empty_directory_and_an_ignored_tree_are_errors(project, capsys):
    (project / "empty").mkdir()
    _nothing_checked(*run(capsys, "empty"), "empty")
    (project / ".git").mkdir()
    (project / ".gitignore").write_text("*\n")
    code, out, err = run(capsys, ".")
    _nothing_checked(code, out, err, ".")
    assert "leave out every one" in err


def test_a_named_fifo_alone_is_an_error_that_says_why(project, capsys):
    if not hasattr(os, "mkfifo"):
        pytest.skip("no FIFOs here")
    os.mkfifo(project / "pipe.py")
    code, out, err = run(capsys, "pipe.py")
    _nothing_checked(code, out, err, "pipe.py")
    assert "pipe.py: not a regular file" in err


def test_a_baseline_of_nothing_is_not_written(project, capsys):
    (project / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["*.py"]\n')
    _nothing_checked(*run(capsys, ".", "--write-baseline", "baseline.json"), ".")
    assert not (project / "baseline.json").exists()


def test_named_files_the_configuration_force_excludes_pass_with_a_note(project, capsys):
    """pre-commit's hook names every staged file with --force-exclude: excluded ones are left out by
    the configuration's choice, and the commit goes through."""
    (project / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["pkg/"]\n')
    code, out, err = run(capsys, "--force-exclude", "--output-format", "concise", "pkg/m.py")
    assert code == 0 and out == "All checks passed!\n"
    assert "1 named file excluded by the configuration (force-exclude): not checked" in err
