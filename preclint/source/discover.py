"""Which files a source-only run reads.

Directories are walked for ``*.py``. Inside a git work tree git itself says which files are not
ignored (``git ls-files --cached --others --exclude-standard``: nested .gitignore files,
.git/info/exclude and the user's global excludes, exactly as git applies them). Outside one, or
without git, the .gitignore files met during the walk are applied by preclint's own matcher.
Files named explicitly are always read (as Ruff does), except that ``exclude`` from the
configuration applies to them too, so a pre-commit hook respects it.
"""
from __future__ import annotations

import os
import subprocess
from typing import Iterable, List, Optional, Sequence, Tuple

from preclint.errors import UserError
from preclint.source.paths import glob_match, glob_regex

# Ruff's default excludes, plus preclint's cache
DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache",
    ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv",
    ".vscode", "__pypackages__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages",
    "venv", ".preclint_cache", "__pycache__",
)


class _GitIgnore:
    """.gitignore semantics for the walk when git cannot answer: last matching pattern wins, ``!``
    re-includes, a trailing ``/`` matches directories only, patterns are relative to their file."""

    def __init__(self):
        self.rules: List[Tuple[str, str, bool, bool]] = []  # (base dir, pattern, negated, dir only)

    def load(self, directory: str) -> None:
        path = os.path.join(directory, ".gitignore")
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                lines = handle.read().splitlines()
        except OSError:
            return
        for raw in lines:
            line = raw.rstrip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            if negated:
                line = line[1:]
            if line.startswith("\\"):
                line = line[1:]
            self.rules.append((directory, line.rstrip("/"), negated, line.endswith("/")))

    def ignored(self, path: str, is_dir: bool) -> bool:
        result = False
        for base, pattern, negated, dir_only in self.rules:
            if dir_only and not is_dir:
                continue
            rel = os.path.relpath(path, base).replace(os.sep, "/")
            if rel.startswith(".."):
                continue
            # the walk prunes ignored directories itself, so a pattern is matched against the path
            # (anchored patterns) or its last name, never against the directories above it
            if "/" in pattern:
                matched = glob_regex(pattern.lstrip("/")).match(rel) is not None
            else:
                matched = glob_regex(pattern).match(rel.rsplit("/", 1)[-1]) is not None
            if matched:
                result = not negated
        return result


def _git_files(directory: str) -> Optional[List[str]]:
    """Files under ``directory`` that git does not ignore, or None outside a work tree / without git."""
    try:
        done = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "."],
            cwd=directory, capture_output=True, timeout=120,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    names = [n for n in done.stdout.decode("utf-8", "surrogateescape").split("\0") if n]
    return [os.path.join(directory, n) for n in dict.fromkeys(names)]


def _excluded(path: str, patterns: Sequence[str], root: str) -> bool:
    rel = os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")
    if rel.startswith("../"):
        rel = os.path.abspath(path).replace(os.sep, "/").lstrip("/")
    return any(glob_match(p, rel) for p in patterns)


def _default_excluded(path: str, top: str) -> bool:
    rel = os.path.relpath(path, top).replace(os.sep, "/")
    return any(part in DEFAULT_EXCLUDE for part in rel.split("/")[:-1])


def _walk(directory: str, exclude: Sequence[str], root: str) -> Iterable[str]:
    gitignore = _GitIgnore()
    for current, dirs, files in os.walk(directory):
        gitignore.load(current)
        dirs[:] = sorted(
            d for d in dirs
            if d not in DEFAULT_EXCLUDE
            and not gitignore.ignored(os.path.join(current, d), True)
            and not _excluded(os.path.join(current, d), exclude, root)
        )
        for name in sorted(files):
            path = os.path.join(current, name)
            if name.endswith(".py") and not gitignore.ignored(path, False):
                yield path


def discover(paths: Sequence[str], exclude: Sequence[str] = (), root: Optional[str] = None) -> List[str]:
    """The Python files to check, sorted, without duplicates. A path that does not exist is a
    UserError; an empty result is not (a pre-commit run may pass no Python file at all)."""
    root = os.path.abspath(root or os.getcwd())
    found = {}
    for given in paths:
        if not os.path.exists(given):
            raise UserError(f"{given}: no such file or directory")
        if os.path.isdir(given):
            listed = _git_files(given)
            if listed is None:
                candidates = list(_walk(given, exclude, root))
            else:
                candidates = [
                    p for p in listed
                    if p.endswith(".py") and not _default_excluded(p, given) and os.path.isfile(p)
                ]
            for path in candidates:
                if not _excluded(path, exclude, root):
                    found[os.path.normpath(path)] = None
        elif not _excluded(given, exclude, root):
            found[os.path.normpath(given)] = None
    return sorted(found)
