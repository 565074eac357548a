"""Which files --source-only reads: directories walked, .gitignore honoured, excludes applied."""
from __future__ import annotations

import pytest

from preclint.core.errors import UserError
from preclint.text.discover import discover
from preclint.text.paths import glob_match

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


def test_inside_a_repository_parents_gitignore_and_info_exclude_apply(tmp_path, monkeypatch):
    make(tmp_path, {**TREE, ".gitignore": "generated/\n", ".git/info/exclude": "third_party/\n",
                    "pkg/sub/.gitignore": "ignored_by_*.py\n!ignored_by_keep.py\n", "pkg/sub/ignored_by_keep.py": ""})
    monkeypatch.chdir(tmp_path / "pkg")
    monkeypatch.setenv("HOME", str(tmp_path))  # no global excludes of the machine's user
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    # walking pkg/ alone still applies the root's .gitignore (generated/) and the last matching
    # pattern of pkg/sub/.gitignore (the re-include)
    assert discover(["."]) == ["a.py", "sub/b.py", "sub/ignored_by_keep.py"]
    monkeypatch.chdir(tmp_path)
    assert "third_party/f.py" not in discover(["."])  # .git/info/exclude
    (tmp_path / ".config" / "git").mkdir(parents=True)
    (tmp_path / ".config" / "git" / "ignore").write_text("a.py\n")  # the user's global excludes
    assert "pkg/a.py" not in discover(["."])


def test_worktree_gitdir_file_is_read_not_run(tmp_path, monkeypatch):
    make(tmp_path, {"common/info/exclude": "skip_*.py\n", "common/worktrees/w/commondir": "../..\n",
                    "w/.git": "gitdir: ../common/worktrees/w\n", "w/keep.py": "", "w/skip_me.py": ""})
    monkeypatch.chdir(tmp_path / "w")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert discover(["."]) == ["keep.py"]


def test_exclude_patterns_apply_to_walks_and_with_force_exclude_to_explicit_files(tmp_path, monkeypatch):
    make(tmp_path, TREE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert "third_party/f.py" not in discover(["."], exclude=["third_party/"])
    # named explicitly: checked whatever the excludes say, as in Ruff
    assert discover(["third_party/f.py"], exclude=["third_party"]) == ["third_party/f.py"]
    assert discover(["build/d.py"]) == ["build/d.py"]
    excluded = []
    assert discover(["third_party/f.py", "build/d.py", "pkg/a.py"], exclude=["third_party"], force_exclude=True,
                    excluded=excluded) == ["pkg/a.py"]
    assert excluded == ["third_party/f.py", "build/d.py"]


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


@pytest.mark.slow
def test_last_matching_pattern_wins_among_thousands(tmp_path, monkeypatch):
    """A generated .gitignore of thousands of patterns: the last one that matches decides."""
    many = "\n".join(f"generated_{i}/" for i in range(5000))
    make(tmp_path, {".gitignore": many + "\n*.py\n!keep*.py\nkeep_not.py\n",
                    "keep_yes.py": "", "keep_not.py": "", "other.py": "", "generated_7/x.py": ""})
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert discover(["."]) == ["keep_yes.py"]
