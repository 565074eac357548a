"""A file named on the command line is checked whatever the configuration's ``exclude`` says, as Ruff
does; ``--force-exclude`` (``force-exclude = true``) applies the excludes to named files too, for
pre-commit, which names every staged file. Directories are walked with the excludes either way.

Before, ``exclude = ["**"]`` in a repository's [tool.preclint] made ``preclint check --source-only
FILE`` print "All checks passed!" and exit 0 for a file with findings: a checked-out pull request
could switch the check off for the files a CI job names.
"""
from __future__ import annotations

import pytest

from preclint.cli import main

AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"
FINDING = "pkg/m.py:3:6: PCL502"


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A project whose configuration excludes everything, with a file that has a source finding."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["**"]\n')
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(AMP)
    return tmp_path


def run(capsys, *args):
    code = main(["check", "--source-only", "--output-format", "concise", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_named_file_is_checked_although_exclude_matches_it(project, capsys):
    code, out, err = run(capsys, "pkg/m.py")
    assert code == 1 and FINDING in out, (out, err)
    assert err == ""


def test_force_exclude_skips_the_named_file_and_says_so_in_one_line(project, capsys):
    code, out, err = run(capsys, "--force-exclude", "pkg/m.py")
    assert code == 0 and out == "All checks passed!\n"
    assert err == "note: 1 named file excluded by the configuration (force-exclude): not checked\n"


def test_force_exclude_from_the_configuration_and_no_force_exclude_on_the_command_line(project, capsys):
    (project / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["pkg/m.py"]\nforce-exclude = true\n')
    (project / "pkg" / "other.py").write_text(AMP)
    code, out, err = run(capsys, "pkg/m.py", "pkg/other.py")
    assert code == 1 and FINDING not in out and "pkg/other.py:3:6: PCL502" in out
    assert "1 named file excluded" in err
    code, out, err = run(capsys, "--no-force-exclude", "pkg/m.py", "pkg/other.py")
    assert code == 1 and FINDING in out and "pkg/other.py:3:6: PCL502" in out and err == ""


def test_a_directory_named_is_walked_with_the_excludes(project, capsys):
    code, out, err = run(capsys, "pkg")  # every file excluded: nothing checked, which is no pass
    assert code == 2 and out == "" and "no Python file was checked under pkg" in err
    (project / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["pkg/vendored/"]\n')
    (project / "pkg" / "vendored").mkdir()
    (project / "pkg" / "vendored" / "old.py").write_text(AMP)
    code, out, _ = run(capsys, "pkg")
    assert code == 1 and FINDING in out and "vendored" not in out


def test_force_exclude_applies_the_default_excludes_as_a_walk_does(project, capsys):
    (project / "pyproject.toml").write_text("[tool.preclint]\n")
    (project / "build").mkdir()
    (project / "build" / "gen.py").write_text(AMP)
    code, out, _ = run(capsys, "build/gen.py")
    assert code == 1 and "build/gen.py:3:6: PCL502" in out  # named: checked
    code, out, err = run(capsys, "--force-exclude", "build/gen.py")
    assert code == 0 and "1 named file excluded" in err


def test_force_exclude_must_be_a_boolean(project, capsys):
    (project / "pyproject.toml").write_text('[tool.preclint]\nforce-exclude = "yes"\n')
    code, out, err = run(capsys, "pkg/m.py")
    assert code == 2 and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith("preclint: error: ")
    assert line.endswith("pyproject.toml: [tool.preclint]: force-exclude must be true or false")
