"""Reading and writing the files a repository gives preclint, so that none can hang, mislead or hurt it.

Only regular files are read: a FIFO, a socket or a device named ``*.py`` or ``.gitignore`` would block
a plain ``open()`` forever (or stream without end), so every file is opened non-blocking and checked
with ``fstat`` on the open descriptor before a byte is read (no window between the check and the read).

Fixes are written in place, into the file's own inode, as Ruff and Black do: the owner, the group,
the mode, hard links, ACLs and extended attributes stay as they were. A rename of a new file over the
old one would be atomic but would give the file a new owner and split its hard links. The write is
made safe the other way round: the file must still hold the bytes preclint read (else an editor
changed it meanwhile, and nothing is written), and an interrupted write (an exception, Ctrl-C) puts
the original bytes back.
"""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Optional


class NotRegularFile(OSError):
    """The path names something other than a regular file (FIFO, socket, device, directory)."""


def _open_flags(follow: bool) -> int:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    return flags


def read_regular(path: str, limit: Optional[int] = None, follow: bool = True) -> bytes:
    """The bytes of ``path`` (at most ``limit``), which must be a regular file. OSError when it cannot
    be read; NotRegularFile when it is not a regular file. ``follow=False`` refuses symlinks."""
    fd = os.open(path, _open_flags(follow))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path}: not a regular file")
        chunks = []
        remaining = limit
        while remaining is None or remaining > 0:
            chunk = os.read(fd, 1 << 20 if remaining is None else min(1 << 20, remaining))
            if not chunk:
                break
            chunks.append(chunk)
            if remaining is not None:
                remaining -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_regular_or_none(path: str, limit: Optional[int] = None, follow: bool = True) -> Optional[bytes]:
    try:
        return read_regular(path, limit, follow)
    except OSError:
        return None


class ChangedOnDisk(OSError):
    """The file no longer holds what preclint read: it was not written."""


def write_in_place(filename: str, data: bytes, expected: Optional[bytes] = None) -> None:
    """Replace the content of the regular file ``filename`` with ``data``, keeping its inode (owner,
    mode, links). With ``expected``, the file must still hold exactly those bytes."""
    fd = os.open(filename, os.O_RDWR | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "r+b") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise NotRegularFile(f"{filename}: not a regular file")
        original = handle.read()
        if expected is not None and original != expected:
            raise ChangedOnDisk(f"{filename}: changed on disk since it was read")
        try:
            handle.seek(0)
            handle.write(data)
            handle.truncate()
            handle.flush()
            os.fsync(handle.fileno())
        except BaseException:
            handle.seek(0)
            handle.write(original)
            handle.truncate()
            handle.flush()
            raise


def write_atomic(filename: str, text: str, encoding: str = "utf-8") -> None:
    """Create or replace ``filename`` (a file preclint owns, such as a baseline) atomically: a
    temporary file in the same directory, flushed, then renamed over it; a failure leaves the
    original untouched. Not for the user's source files: see ``write_in_place``."""
    target = os.path.realpath(filename)  # through a symlink, to the file it names
    data = text.encode(encoding)
    try:
        info = os.stat(target)
        mode, owner = stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode, owner = 0o666 & ~umask, None
    directory, base = os.path.split(target)
    handle, temporary = tempfile.mkstemp(prefix=f".{base}.", suffix=".preclint", dir=directory or ".")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, mode)
        if owner is not None and owner != (os.geteuid(), os.getegid()):
            try:
                os.chown(temporary, *owner)
            except OSError:  # only root may give a file away: it then belongs to whoever runs preclint
                pass
        os.replace(temporary, target)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
