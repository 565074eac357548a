"""Paths as preclint prints them, and glob matching for config patterns (exclude, per-file-ignores).

Printed paths are relative to the working directory so that output, baselines and SARIF URIs are the
same on every machine that checks out the repository.
"""
from __future__ import annotations

import functools
import os
import sys
from typing import Optional, Tuple

from preclint.text.globs import compiled


def display_path(path: str, cwd: Optional[str] = None, inside_only: bool = False) -> str:
    """``path`` relative to ``cwd`` with forward slashes; absolute when there is no relative path
    (another drive on Windows), or with ``inside_only`` when it is not inside ``cwd``."""
    absolute = os.path.abspath(path)
    try:
        rel = os.path.relpath(absolute, cwd or os.getcwd())
    except ValueError:
        return absolute.replace(os.sep, "/")
    if inside_only and rel.split(os.sep, 1)[0] == os.pardir:
        return absolute.replace(os.sep, "/")
    return rel.replace(os.sep, "/")


_LIBRARY_DIRS = ("site-packages", "dist-packages")
# packages whose files are library code even when installed from a source checkout (no site-packages)
_LIBRARY_PACKAGES = ("torch", "torchvision")


def library_path(path: str) -> Optional[str]:
    """``path`` relative to the directory its library is imported from (``torchvision/models/resnet.py``),
    or None when the file is not an installed library's: the user's own code."""
    parts = os.path.abspath(path).replace(os.sep, "/").split("/")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] in _LIBRARY_DIRS:
            return "/".join(parts[i + 1:])
    absolute = os.path.abspath(path)
    for name in _LIBRARY_PACKAGES:
        package = sys.modules.get(name)
        root = os.path.dirname(os.path.abspath(getattr(package, "__file__", None) or "")) if package else ""
        if root and absolute.startswith(root + os.sep):
            return display_path(absolute, os.path.dirname(root))
    return None


def display_place(path: str) -> Tuple[str, bool]:
    """(the path as preclint prints it, whether it is a library's): a library's file relative to the
    directory it is imported from, the same on every machine; any other relative to the working directory."""
    if path.startswith("<"):
        return path, False
    return _display_place(path, os.getcwd())


@functools.lru_cache(maxsize=4096)
def _display_place(path: str, cwd: str) -> Tuple[str, bool]:
    # (a ledger prints the place of every node of a model: thousands of rows from a few dozen files)
    library = library_path(path)
    return (library, True) if library is not None else (display_path(path, cwd), False)


def glob_match(pattern: str, relpath: str) -> bool:
    """Whether ``relpath`` (relative to the directory that holds the pattern, '/'-separated) matches.

    As in .gitignore and Ruff's settings: a pattern without a slash matches a file or directory name
    at any depth; a pattern with one is anchored at that directory; a match on a directory covers
    everything below it. In time linear in the path's length (text/globs.py); a GlobError for a
    pattern that is no glob.
    """
    pattern = pattern.strip()
    if not pattern:
        return False
    pattern = pattern.replace(os.sep, "/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    anchored = "/" in pattern.rstrip("/")
    pattern = pattern.strip("/") if anchored else pattern.rstrip("/")
    matcher = compiled(pattern)
    relpath = relpath.replace(os.sep, "/")
    if anchored:
        return bool(matcher.matching_leading(relpath))
    return any(matcher.matching(part) for part in relpath.split("/"))
