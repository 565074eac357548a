"""Which files --source-only reads: directories walked, .gitignore honoured, excludes applied."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from preclint.errors import UserError
from preclint.source.discover import discover
from preclint.source.paths import glob_match

TREE = {
    "pkg/a.py": "x = 1\n",
    "pkg/sub/b.py": "x = 1\n",
    "pkg/notes.txt": "",
    "pkg/generated/c.py": "x = 1\n",
    "pkg/sub/ignored_by_sub.py": "x = 1\n",
    "build/d.py": "x = 1\n",
    ".venv/e.py": "x = 1\n",
    "third_party/f.py": "x = 1\n",
}
GITIGNORE = {".gitignore": "generated/\n*.tmp\n", "pkg/sub/.gitignore": "ignored_by_*.py\n"}


def make(tmp_path, files):
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def rel(tmp_path, files):
    return sorted(str(p.relative_to(tmp_path)) if hasattr(p, "relative_to") else p for p in files)


EXPECTED = ["pkg/a.py", "pkg/sub/b.py", "third_party/f.py"]


def test_walk_without_git_applies_gitignore_files(tmp_path, monkeypatch):
    make(tmp_path, {**TREE, **GITIGNORE})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # not inside any repository
    assert discover(["."]) == EXPECTED


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_walk_inside_git_asks_git(tmp_path, monkeypatch):
    make(tmp_path, {**TREE, **GITIGNORE})
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    monkeypatch.chdir(tmp_path)
    assert discover(["."]) == EXPECTED
    # a tracked file stays visible even where a pattern would ignore it, as git sees it
    subprocess.run(["git", "add", "-f", "pkg/generated/c.py"], cwd=tmp_path, check=True)
    assert "pkg/generated/c.py" in discover(["."])


def test_exclude_patterns_apply_to_walks_and_explicit_files(tmp_path, monkeypatch):
    make(tmp_path, TREE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert "third_party/f.py" not in discover(["."], exclude=["third_party/"])
    assert discover(["third_party/f.py"], exclude=["third_party"]) == []
    assert discover(["build/d.py"]) == ["build/d.py"]  # named explicitly: default excludes do not apply


def test_missing_path_is_a_user_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="nope.py: no such file"):
        discover(["nope.py"])


@pytest.mark.parametrize(
    "pattern, path, expected",
    [
        ("tests/**", "tests/unit/test_a.py", True),
        ("tests/", "tests/unit/test_a.py", True),
        ("tests", "src/tests/x.py", True),
        ("/tests", "src/tests/x.py", False),
        ("*.py", "a/b/c.py", True),
        ("src/*.py", "src/a/b.py", False),
        ("**/conftest.py", "a/b/conftest.py", True),
        ("test_[ab].py", "x/test_b.py", True),
    ],
)
def test_glob_semantics(pattern, path, expected):
    assert glob_match(pattern, path) is expected
