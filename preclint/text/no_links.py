"""Reaching the directory of a file preclint writes without following a link on the way.

A checkout can commit ``reports -> /home/runner/.ssh`` (or any directory): ``-o reports/x.sarif``,
``--write-baseline reports/b.json`` and ``--fix dir_link/x.py`` would then write outside it. So every
directory of the path, from ``/`` for an absolute path or from the working directory for a relative one,
is opened in turn relative to the one before, with ``O_NOFOLLOW``: a link anywhere on the way is met
as a link (``LinkOnPath``), and no one can swap a directory for a link between a check and the write.
The file is then created, replaced or opened relative to the directory reached (``dir_fd``).
"""
from __future__ import annotations

import errno
import os
import stat
from typing import Iterator, Optional, Tuple

# O_PATH (Linux): a directory one may pass through but not list (mode 711) is opened all the same
_DIRECTORY_FLAGS = (getattr(os, "O_PATH", os.O_RDONLY) | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
                    | getattr(os, "O_CLOEXEC", 0))
WITH_DIR_FD = {os.open, os.stat, os.unlink, os.rename} <= os.supports_dir_fd  # (os.replace as os.rename)


class LinkOnPath(OSError):
    """A directory on the way to the file is a symbolic link; ``link`` is the path up to it, as given."""

    def __init__(self, path: str, link: str):
        super().__init__(errno.ELOOP, f"{link} is a symbolic link", path)
        self.link = link

    def refusal(self, what: str) -> str:
        """The one line that says why the file is not written."""
        return (f"{self.filename}: {self.link} is a symbolic link; preclint does not write the {what} through "
                "links (a repository can aim one at any directory): name a path without links")


def _steps(path: str) -> Iterator[Tuple[str, str]]:
    """(a directory of ``path`` on the way to its last part, the path up to and with it as given)."""
    parts = path.split(os.sep)
    shown = os.sep if path.startswith(os.sep) else ""
    for part in parts[:-1]:
        if part in ("", "."):
            continue
        shown = os.path.join(shown, part) if shown else part
        yield part, shown


def link_on_path(path: str) -> Optional[str]:
    """The first directory on the way to ``path`` that is a symbolic link (the path up to it), or None:
    for the checks made before any work is done (the write itself opens the way again)."""
    for _part, shown in _steps(path):
        try:
            if stat.S_ISLNK(os.lstat(shown).st_mode):
                return shown
        except OSError:
            return None  # a directory that does not exist: the write says so
    return None


def open_parent(path: str) -> Tuple[Optional[int], str]:
    """(a descriptor of the directory that holds ``path``, reached without following a link, the
    file's name in it). The caller closes the descriptor. Where the system has no ``dir_fd``
    (Windows), (None, ``path``) after each directory was looked at with ``lstat``. A link on the
    way raises LinkOnPath; a directory missing, FileNotFoundError."""
    name = path.split(os.sep)[-1]
    if not WITH_DIR_FD:
        link = link_on_path(path)
        if link is not None:
            raise LinkOnPath(path, link)
        return None, path
    fd = os.open(os.sep if path.startswith(os.sep) else ".", _DIRECTORY_FLAGS)
    try:
        for part, shown in _steps(path):
            try:
                step = os.open(part, _DIRECTORY_FLAGS, dir_fd=fd)
            except OSError as exc:
                # ELOOP, ENOTDIR, or FreeBSD's EMLINK for O_NOFOLLOW: a link, if lstat says so
                if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK) and _is_link(part, fd):
                    raise LinkOnPath(path, shown) from None
                raise
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd, name


def _is_link(name: str, directory: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=directory, follow_symlinks=False).st_mode)
    except OSError:
        return False


def at(fd: Optional[int]) -> dict:
    """The keyword arguments that make a call of ``os`` relative to ``fd`` (none without one)."""
    return {} if fd is None else {"dir_fd": fd}
