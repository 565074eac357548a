"""Which files a source-only run reads.

Directories are walked for ``*.py`` files, with .gitignore semantics applied by preclint itself, the
way Ruff does: the .gitignore files of the walked directories and of their parents up to the
repository root, the repository's ``.git/info/exclude`` and the user's global excludes file. Ruff's
default excludes (``.venv``, ``build``, ...) are skipped too, and so is what the configuration's
``exclude`` matches. Files named explicitly are read whatever the excludes say (a user who names a
file wants it checked), unless ``force_exclude`` is set (``--force-exclude``, as in Ruff): then the
configuration's ``exclude`` and the default excludes apply to them as to the files of a walk, for
pre-commit, which names every staged file.

git itself is never run. A checked repository may be untrusted (a pull request, an archive), and git
honours the repository's own configuration: ``core.fsmonitor`` runs a command on ``git ls-files``,
and hooks, filter drivers, ``include.path``, ``core.worktree`` or a ``.git`` file pointing elsewhere
open more ways to run code or read another repository; new versions of git add new ones. Reading
the ignore files is data only. The one difference from ``git ls-files``: a tracked file that an
ignore pattern matches is skipped, as Ruff skips it.

Only regular files are checked. A FIFO, socket or device named ``*.py`` (which would block a read
forever) and a dangling symlink are skipped with a note; a symlink to a checked file is checked once,
under the file's own path where the walk meets both. Symlinked directories are not followed.
"""
from __future__ import annotations

import os
import re
import stat
from typing import Dict, List, Optional, Sequence, Tuple

from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.text.globs import GlobSet
from preclint.text.paths import glob_match
from preclint.text.safe_io import read_regular_or_none

# Ruff's default excludes, plus preclint's cache
DEFAULT_EXCLUDE = (
    ".bzr", ".direnv", ".eggs", ".git", ".git-rewrite", ".hg", ".ipynb_checkpoints", ".mypy_cache",
    ".nox", ".pants.d", ".pyenv", ".pytest_cache", ".pytype", ".ruff_cache", ".svn", ".tox", ".venv",
    ".vscode", "__pypackages__", "_build", "buck-out", "build", "dist", "node_modules", "site-packages",
    "venv", ".preclint_cache", "__pycache__",
)
# an ignore file is read this far (bytes, patterns)
IGNORE_FILE_LIMIT = 256 * 1024
IGNORE_PATTERN_LIMIT = 10_000


class PatternFile:
    """The patterns of one ignore file, relative to ``base``. gitignore semantics: the last matching
    pattern wins, ``!`` re-includes, a trailing ``/`` matches directories only, a pattern with a
    slash before its end is anchored at ``base``, one without matches a name at any depth.

    The patterns run as two automata (text/globs.py), the anchored ones on the path and the others
    on the name: a path costs two passes over its characters however many patterns the file has, and
    no pattern can make a pass slower than linear (a backtracking regex of ``*a*a*a*a*a*a*a*a*b``
    does not end). A pattern that is no glob (a backward class range) is not applied."""

    def __init__(self, base: str, text: str):
        self.base = base
        # (pattern, negated, directories only, order in the file): the anchored ones and the others
        anchored: List[Tuple[str, bool, bool, int]] = []
        by_name: List[Tuple[str, bool, bool, int]] = []
        for raw in text.splitlines()[:IGNORE_PATTERN_LIMIT]:
            line = raw.rstrip("\r")
            if not line or line.startswith("#"):
                continue
            line = re.sub(r"(?<!\\) +$", "", line)  # trailing spaces, unless escaped
            negated = line.startswith("!")
            if negated:
                line = line[1:]
            line = line.replace("\\ ", " ")
            if line.startswith("\\"):
                line = line[1:]  # \# and \! start a literal
            dir_only = line.endswith("/")
            line = line.rstrip("/")
            if line:
                # (the order across both lists: the last matching pattern of the file wins)
                entry = (line.lstrip("/"), negated, dir_only, len(anchored) + len(by_name))
                (anchored if "/" in line else by_name).append(entry)
        self.entries = len(anchored) + len(by_name)
        self._anchored = [entry[1:] for entry in anchored]
        self._by_name = [entry[1:] for entry in by_name]
        self._anchored_set = GlobSet([entry[0] for entry in anchored], skip_bad=True)
        self._by_name_set = GlobSet([entry[0] for entry in by_name], skip_bad=True)

    def match(self, path: str, is_dir: bool) -> Optional[bool]:
        """True: ignored, False: re-included, None: no pattern of this file matches."""
        if not self.entries:
            return None
        rel = os.path.relpath(path, self.base).replace(os.sep, "/")
        if rel.startswith("../") or rel == "..":
            return None
        name = rel.rsplit("/", 1)[-1]
        last: Optional[Tuple[int, bool]] = None  # (order in the file, negated) of the last matching pattern
        for found, entries in ((self._anchored_set.matching(rel) if self._anchored else [], self._anchored),
                               (self._by_name_set.matching(name) if self._by_name else [], self._by_name)):
            for index in found:
                negated, dir_only, order = entries[index]
                if (is_dir or not dir_only) and (last is None or order > last[0]):
                    last = (order, negated)
        return None if last is None else not last[1]


def _load(path: str, base: str, follow: bool = False) -> Optional[PatternFile]:
    """The ignore file at ``path`` if it is a regular file (git does not follow a symlinked
    .gitignore inside the work tree either)."""
    data = read_regular_or_none(path, IGNORE_FILE_LIMIT, follow=follow)
    if not data:
        return None
    return PatternFile(base, data.decode("utf-8", "replace"))


def repository_root(directory: str) -> Optional[str]:
    """The nearest directory at or above ``directory`` that holds a ``.git`` entry."""
    current = os.path.abspath(directory)
    while True:
        if os.path.lexists(os.path.join(current, ".git")):
            return current
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _git_dir(root: str) -> Optional[str]:
    """The repository's git directory: ``.git`` itself, or where a ``gitdir:`` file points (a worktree
    or a submodule), then its common directory. Only read, never executed."""
    dot_git = os.path.join(root, ".git")
    if os.path.isdir(dot_git) and not os.path.islink(dot_git):
        return dot_git
    data = read_regular_or_none(dot_git, 4096, follow=False)
    if not data or not data.startswith(b"gitdir:"):
        return None
    git_dir = os.path.join(root, data[len(b"gitdir:"):].strip().decode("utf-8", "replace"))
    common = read_regular_or_none(os.path.join(git_dir, "commondir"), 4096)
    if common:
        git_dir = os.path.join(git_dir, common.strip().decode("utf-8", "replace"))
    return git_dir


def _global_excludes_file() -> Optional[str]:
    """The user's global excludes: ``core.excludesFile`` of their own git configuration (a plain read
    of the key, nothing executed), else git's default ``$XDG_CONFIG_HOME/git/ignore``."""
    home = os.path.expanduser("~")
    xdg = os.environ.get("XDG_CONFIG_HOME") or os.path.join(home, ".config")
    for config in (os.path.join(home, ".gitconfig"), os.path.join(xdg, "git", "config")):
        data = read_regular_or_none(config, IGNORE_FILE_LIMIT)
        if not data:
            continue
        section = ""
        for line in data.decode("utf-8", "replace").splitlines():
            line = line.strip()
            if line.startswith("["):
                section = line.strip("[] \t").lower()
            elif section == "core" and "=" in line:
                key, _, value = line.partition("=")
                if key.strip().lower() == "excludesfile":
                    return os.path.expanduser(value.split("#")[0].split(";")[0].strip().strip('"'))
    return os.path.join(xdg, "git", "ignore")


class IgnoreRules:
    """The ignore files that apply inside a directory, most specific first."""

    def __init__(self, files: Sequence[PatternFile] = ()):
        self.files = list(files)

    def with_directory(self, directory: str) -> "IgnoreRules":
        loaded = _load(os.path.join(directory, ".gitignore"), directory)
        return IgnoreRules([loaded] + self.files) if loaded else self

    def ignored(self, path: str, is_dir: bool) -> bool:
        for patterns in self.files:
            verdict = patterns.match(path, is_dir)
            if verdict is not None:
                return verdict
        return False

    @classmethod
    def above(cls, top: str) -> "IgnoreRules":
        """The rules in force at ``top`` before its own .gitignore: inside a repository, the global
        excludes, ``info/exclude`` and the .gitignore files from the root down to ``top``'s parent."""
        top = os.path.abspath(top)
        root = repository_root(top)
        rules = cls()
        if root is None:
            return rules
        global_file = _global_excludes_file()
        if global_file:
            loaded = _load(global_file, root, follow=True)
            if loaded:
                rules = cls([loaded])
        git_dir = _git_dir(root)
        if git_dir:
            loaded = _load(os.path.join(git_dir, "info", "exclude"), root, follow=True)
            if loaded:
                rules = cls([loaded] + rules.files)
        rel = os.path.relpath(top, root)
        if rel != ".":
            current = root
            for part in rel.split(os.sep):  # the root, then each directory down to top's parent
                rules = rules.with_directory(current)
                current = os.path.join(current, part)
        return rules


def _excluded(path: str, patterns: Sequence[str], root: str) -> bool:
    if not patterns:
        return False
    rel = os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")
    if rel.startswith("../"):
        rel = os.path.abspath(path).replace(os.sep, "/").lstrip("/")
    return any(glob_match(p, rel) for p in patterns)


def _force_excluded(path: str, patterns: Sequence[str], root: str) -> bool:
    """Whether a walk from ``root`` would leave out the file ``path`` by an exclude: a pattern of the
    configuration, or a default-excluded directory (``.venv``, ``build``) between ``root`` and it."""
    if _excluded(path, patterns, root):
        return True
    rel = os.path.relpath(os.path.abspath(path), root).replace(os.sep, "/")
    if rel.startswith("../"):
        return False  # outside the project: no walk of it would reach the file
    return any(part in DEFAULT_EXCLUDE for part in rel.split("/")[:-1])


class Walk:
    """The candidate files of the directories walked, and the notes about what was skipped."""

    def __init__(self, exclude: Sequence[str], root: str, notes: List[Note]):
        self.exclude = exclude
        self.root = root
        self.notes = notes

    def files(self, top: str) -> List[Tuple[str, bool]]:
        """(path, is a symlink) of every ``*.py`` regular file under ``top`` that is not ignored."""
        found: List[Tuple[str, bool]] = []
        stack = [(top, IgnoreRules.above(top))]
        while stack:
            directory, rules = stack.pop()
            rules = rules.with_directory(directory)
            try:
                entries = sorted(os.scandir(directory), key=lambda e: e.name)
            except OSError as exc:
                self.notes.append(Note("source", f"{directory}: cannot list the directory ({exc.strerror or exc}); skipped"))
                continue
            subdirs = []
            for entry in entries:
                path = os.path.join(directory, entry.name)
                try:
                    if entry.is_dir(follow_symlinks=False):
                        if (entry.name not in DEFAULT_EXCLUDE and not rules.ignored(path, True)
                                and not _excluded(path, self.exclude, self.root)):
                            subdirs.append(path)
                        continue
                    if not entry.name.endswith(".py") or rules.ignored(path, False):
                        continue
                    link = entry.is_symlink()
                    kind = self.kind(path)
                except OSError:
                    continue
                if kind is None:
                    found.append((path, link))
                else:
                    self.notes.append(Note("source", f"{path}: {kind}; skipped"))
            stack.extend((d, rules) for d in reversed(subdirs))
        return found

    @staticmethod
    def kind(path: str) -> Optional[str]:
        """None for a regular file (through symlinks), else what it is, for a note."""
        try:
            info = os.stat(path)
        except FileNotFoundError:
            return "a dangling symlink" if os.path.islink(path) else "gone"
        except OSError as exc:
            return f"cannot be read ({exc.strerror or exc})"
        if stat.S_ISREG(info.st_mode):
            return None
        if stat.S_ISDIR(info.st_mode):
            return "a symlink to a directory (not followed)"
        return "not a regular file (a FIFO, socket or device)"


def discover(
    paths: Sequence[str],
    exclude: Sequence[str] = (),
    root: Optional[str] = None,
    notes: Optional[List[Note]] = None,
    *,
    force_exclude: bool = False,
    excluded: Optional[List[str]] = None,
) -> List[str]:
    """The Python files to check, sorted, each once (a file reached through several paths, by
    symlinks or hard links, is checked under one of them, preferring a path that is no symlink).
    A path that does not exist is a UserError; an empty result is not (a pre-commit run may pass no
    Python file at all). What is skipped is described in ``notes``; the files named in ``paths``
    that ``force_exclude`` leaves out are appended to ``excluded``."""
    root = os.path.abspath(root or os.getcwd())
    notes = notes if notes is not None else []
    walk = Walk(exclude, root, notes)
    candidates: List[Tuple[str, bool]] = []
    for given in paths:
        if not os.path.lexists(given):
            raise UserError(f"{given}: no such file or directory")
        if os.path.isdir(given):
            candidates.extend((p, link) for p, link in walk.files(given) if not _excluded(p, exclude, root))
        elif force_exclude and _force_excluded(given, exclude, root):
            if excluded is not None:
                excluded.append(given)
        else:
            kind = Walk.kind(given)
            if kind == "a dangling symlink":
                raise UserError(f"{given}: a dangling symlink")
            if kind is not None:
                notes.append(Note("source", f"{given}: {kind}; skipped"))
                continue
            candidates.append((given, os.path.islink(given)))
    chosen: Dict[Tuple[int, int], Tuple[str, bool]] = {}
    for path, link in sorted((os.path.normpath(p), link) for p, link in candidates):
        try:
            info = os.stat(path)
        except OSError:
            continue
        key = (info.st_dev, info.st_ino)
        if key not in chosen or (chosen[key][1] and not link):
            chosen[key] = (path, link)
    return sorted(path for path, _ in chosen.values())
