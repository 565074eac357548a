"""Reading and writing the files a repository gives preclint, so that none can hang, mislead or hurt it.

Only regular files are read: a FIFO, a socket or a device named ``*.py`` or ``.gitignore`` would block
a plain ``open()`` forever (or stream without end), so every file is opened non-blocking and checked
with ``fstat`` on the open descriptor before a byte is read (no window between the check and the read).
What preclint parses whole (a baseline, a configuration, a policy, its cache) is also bounded: a size
limit (``max_size``: a link to ``/dev/zero`` or ``/proc/kcore`` is refused, not read until memory runs
out) and, for JSON, a nesting limit checked before the parser recurses (``load_json``).

Fixes are written so that a file is either fixed or untouched (``replace_checked``): a file with one
name, owned by whoever runs preclint, is replaced by a renamed temporary file beside it (atomic even if
the process dies mid-write); any other (hard links, another owner, extended attributes such as ACLs)
is written in place, into its own inode, as Ruff and Black do, so its identity stays, and an
interrupted write puts the original bytes back. Either way the file must still hold the bytes
preclint read (else an editor changed it meanwhile, and nothing is written), and a file preclint may
not write (its mode, an immutable flag) is left alone.

preclint's own files (the cache) live in a ``PrivateDirectory``: each level is a real directory this
user owns, every file is opened relative to it without following links, and one that is a link, a
special file or another user's is refused (``NotOurs``), never read or written through.
"""
from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
from itertools import accumulate
from typing import Optional, Sequence, Union

from preclint.text.no_links import at, open_parent

MAX_JSON_DEPTH = 32  # preclint's documents nest 6 levels at most (the cache)


class Refused(OSError):
    """A file preclint will not read or write; ``strerror`` says why, ``str()`` is ``path: why``."""

    def __init__(self, path: str, reason: str):
        super().__init__(errno.EINVAL, reason, path)

    def __str__(self) -> str:
        return f"{self.filename}: {self.strerror}"


class NotRegularFile(Refused):
    """The path names something other than a regular file (FIFO, socket, device, directory)."""

    def __init__(self, path: str, reason: str = "not a regular file"):
        super().__init__(path, reason)


class TooLarge(Refused):
    """The file is larger than preclint reads for what it is."""


class TooDeep(ValueError):
    """A JSON document nested deeper than preclint reads."""


class NotOurs(Refused):
    """One of preclint's own files or directories is not what preclint made: a link, a special file,
    another user's. It is neither read nor written."""


def _open_flags(follow: bool) -> int:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    return flags


def _read_open(fd: int, path: str, limit: Optional[int], max_size: Optional[int]) -> bytes:
    """The bytes of the open regular file ``fd``: at most ``limit`` (the rest unread), or all of them
    if there are no more than ``max_size`` (TooLarge otherwise: a /proc file may claim size 0)."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(path)
    if max_size is not None:
        if info.st_size > max_size:
            raise TooLarge(path, f"larger than {_size(max_size)}")
        limit = max_size + 1 if limit is None else min(limit, max_size + 1)
    chunks = []
    remaining = limit
    while remaining is None or remaining > 0:
        chunk = os.read(fd, 1 << 20 if remaining is None else min(1 << 20, remaining))
        if not chunk:
            break
        chunks.append(chunk)
        if remaining is not None:
            remaining -= len(chunk)
    data = b"".join(chunks)
    if max_size is not None and len(data) > max_size:
        raise TooLarge(path, f"larger than {_size(max_size)}")
    return data


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_regular(path: str, limit: Optional[int] = None, follow: bool = True, max_size: Optional[int] = None) -> bytes:
    """The bytes of ``path`` (at most ``limit``), which must be a regular file. OSError when it cannot
    be read; NotRegularFile when it is not a regular file; TooLarge when it holds more than
    ``max_size`` bytes. ``follow=False`` refuses symlinks."""
    fd = os.open(path, _open_flags(follow))
    try:
        return _read_open(fd, path, limit, max_size)
    finally:
        os.close(fd)


def read_regular_or_none(path: str, limit: Optional[int] = None, follow: bool = True) -> Optional[bytes]:
    try:
        return read_regular(path, limit, follow)
    except OSError:
        return None


# a JSON string (escapes included), whose brackets do not nest; then one step per bracket byte
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")
_STEP = tuple(1 if b in b"[{" else -1 if b in b"]}" else 0 for b in range(256))


def json_depth(data: bytes) -> int:
    """How deeply the arrays and objects of the JSON text ``data`` nest (no recursion: a nesting the
    parser would recurse into until the stack ends is measured first)."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _BRACKETS)
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def parse_json(data: bytes, max_depth: int = MAX_JSON_DEPTH):
    """The JSON document ``data`` (UTF-8). ValueError when it is not JSON (UnicodeDecodeError, a
    ValueError, when it is not UTF-8); TooDeep when it nests more than ``max_depth`` levels."""
    depth = json_depth(data)
    if depth > max_depth:
        raise TooDeep(f"nested {depth} levels deep, more than the limit of {max_depth}")
    try:
        return json.loads(data.decode("utf-8"))
    except RecursionError:  # not reached below the limit; kept as the parser's own guard
        raise TooDeep(f"nested more deeply than the parser can follow (the limit is {max_depth})") from None


def load_json(path: str, max_size: int, max_depth: int = MAX_JSON_DEPTH):
    """``parse_json`` of the regular file ``path`` of at most ``max_size`` bytes: a FIFO or a device
    (or a link to one) is refused without blocking (NotRegularFile), a larger file unread (TooLarge)."""
    return parse_json(read_regular(path, max_size=max_size), max_depth)


class ChangedOnDisk(OSError):
    """The file no longer holds what preclint read: it was not written."""


def _overwrite(handle, data: bytes, original: bytes) -> None:
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


def replace_checked(filename: str, data: bytes, expected: Optional[bytes] = None) -> None:
    """Give the regular file ``filename`` the content ``data``, leaving it fixed or untouched: opened
    for writing first (a file preclint may not write is refused, OSError, as an editor would refuse
    it), then, with ``expected``, checked to hold those bytes still (ChangedOnDisk). A file of one
    name that this user owns, without extended attributes, is replaced by a temporary file renamed
    over it (same mode and group); any other is written in place, into its own inode, so that its hard
    links, owner and ACLs stay (an interrupted write puts the original bytes back). The directories on
    the way are not followed through links (LinkOnPath, text/no_links.py)."""
    parent, name = open_parent(filename)
    try:
        fd = os.open(name, os.O_RDWR | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0), **at(parent))
        with os.fdopen(fd, "r+b") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise NotRegularFile(filename)
            original = handle.read()
            if expected is not None and original != expected:
                raise ChangedOnDisk(f"{filename}: changed on disk since it was read")
            if not (_renamable(handle.fileno(), info) and _replace_by_rename(parent, name, data, info)):
                _overwrite(handle, data, original)
    finally:
        if parent is not None:
            os.close(parent)


def _renamable(fd: int, info: os.stat_result) -> bool:
    if info.st_nlink != 1 or not hasattr(os, "geteuid") or info.st_uid != os.geteuid():
        return False
    listxattr = getattr(os, "listxattr", None)
    if listxattr is None:  # no telling whether it has ACLs: it keeps its inode
        return False
    try:
        return not listxattr(fd)  # ACLs, security labels: a new inode would not have them
    except OSError:  # a file system without extended attributes
        return True


def _replace_by_rename(parent: Optional[int], name: str, data: bytes, info: os.stat_result) -> bool:
    """Whether the file ``name`` (in the directory ``parent``) was replaced by a new file holding
    ``data``. False when no such file can be made as the old one was (a directory preclint may not
    write, a group it cannot give): nothing changed, and the caller writes in place. A failure to write
    the new file (a full disk) raises, the old one untouched."""
    try:
        handle, temporary = _temporary_beside(parent, name)
    except OSError:
        return False
    try:
        with os.fdopen(handle, "wb") as out:
            try:
                os.fchmod(out.fileno(), stat.S_IMODE(info.st_mode))
                if os.fstat(out.fileno()).st_gid != info.st_gid:
                    os.fchown(out.fileno(), -1, info.st_gid)
            except OSError:
                _remove(temporary, parent)
                return False
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        current = os.stat(name, follow_symlinks=False, **at(parent))  # still the file that was read
        if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
            raise ChangedOnDisk(f"{name}: replaced on disk since it was read")
        os.replace(temporary, name, **_both(parent))
        return True
    except BaseException:
        _remove(temporary, parent)
        raise


def _temporary_beside(parent: Optional[int], name: str):
    """(a descriptor, the name) of a new, empty file only this user may read, made exclusively beside
    ``name`` in ``parent`` (never an existing file or a link)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    prefix = os.path.join(os.path.dirname(name), "." + os.path.basename(name))  # (a path without a dir_fd)
    for _ in range(100):
        temporary = f"{prefix}.{secrets.token_hex(6)}.preclint"
        try:
            return os.open(temporary, flags, 0o600, **at(parent)), temporary
        except FileExistsError:
            continue
    raise FileExistsError(errno.EEXIST, "no unused temporary name", name)


def _both(parent: Optional[int]) -> dict:
    return {} if parent is None else {"src_dir_fd": parent, "dst_dir_fd": parent}


def _remove(filename: str, dir_fd: Optional[int] = None) -> None:
    try:
        os.unlink(filename, dir_fd=dir_fd)
    except OSError:
        pass


def write_atomic(filename: str, text: Union[str, bytes], encoding: str = "utf-8") -> None:
    """Create or replace ``filename`` (a file preclint writes, such as a baseline or a report)
    atomically: a temporary file in the same directory (created exclusively: never an existing file
    or a link), flushed, then renamed over the name itself; a failure leaves the original untouched.
    No directory on the way is followed through a link (LinkOnPath); a symlink at ``filename`` is
    replaced, never written through (the caller refuses one first:
    ``preclint.report.output.write_output_file``). Not for the user's source files: see
    ``replace_checked``. ``text`` may be bytes already encoded."""
    data = text if isinstance(text, bytes) else text.encode(encoding)
    parent, name = open_parent(filename)
    try:
        write_atomic_at(parent, name, data)
    finally:
        if parent is not None:
            os.close(parent)


def write_atomic_at(parent: Optional[int], name: str, data: bytes) -> None:
    """``write_atomic`` of the file ``name`` in the open directory ``parent`` (None: ``name`` is a path)."""
    try:
        info = os.stat(name, follow_symlinks=False, **at(parent))
        mode, owner = stat.S_IMODE(info.st_mode), (info.st_uid, info.st_gid)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFile(name)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        mode, owner = 0o666 & ~umask, None
    handle, temporary = _temporary_beside(parent, name)
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
            if hasattr(os, "fchmod"):  # on the descriptor: the name could be swapped meanwhile
                os.fchmod(out.fileno(), mode)
            else:  # Windows before Python 3.13
                os.chmod(temporary, mode)
            if owner is not None and hasattr(os, "fchown") and owner != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(out.fileno(), *owner)
                except OSError:  # only root may give a file away: it then belongs to whoever runs preclint
                    pass
        os.replace(temporary, name, **_both(parent))
    except BaseException:
        _remove(temporary, parent)
        raise


_DIR_FD = {os.open, os.mkdir, os.stat, os.rename, os.unlink} <= os.supports_dir_fd


class PrivateDirectory:
    """``base``/``parts``... as a directory for preclint's own files. ``base`` is where the user said
    (``$PRECLINT_CACHE_DIR``: it may be a link, or shared); each of ``parts`` is created if missing
    and must be a real directory this user owns (group and others lose write access to it). Files in
    it are opened relative to the open directory, never through a link, and must be this user's
    regular files: anything else raises NotOurs. Use it as a context manager."""

    def __init__(self, base: str, parts: Sequence[str]):
        self.path = base
        self.fd: Optional[int] = None
        os.makedirs(base, exist_ok=True)
        if _DIR_FD:
            self.fd = os.open(base, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            for part in parts:
                self._enter(part)
        except BaseException:
            self.close()
            raise

    def _where(self, name: str) -> dict:
        return {"path": name, "dir_fd": self.fd} if self.fd is not None else {"path": os.path.join(self.path, name)}

    def _enter(self, part: str) -> None:
        where = self._where(part)
        try:
            os.mkdir(where["path"], 0o700, dir_fd=where.get("dir_fd"))
        except FileExistsError:
            pass
        self.path = os.path.join(self.path, part)
        if self.fd is None:
            _check_ours(os.lstat(self.path), self.path, stat.S_ISDIR, "a directory")
            return
        flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(part, flags, dir_fd=self.fd)
        except NotADirectoryError:  # a link (O_NOFOLLOW) or a file
            _check_ours(os.stat(part, dir_fd=self.fd, follow_symlinks=False), self.path, stat.S_ISDIR, "a directory")
            raise
        except OSError as exc:
            raise _not_ours_or(exc, self.path)
        os.close(self.fd)
        self.fd = fd
        info = os.fstat(fd)
        _check_ours(info, self.path, stat.S_ISDIR, "a directory")
        if stat.S_IMODE(info.st_mode) & 0o022:  # made with a loose umask: nobody else may put files in it
            os.fchmod(fd, stat.S_IMODE(info.st_mode) & ~0o022)

    def read(self, name: str, max_size: int) -> Optional[bytes]:
        """The bytes of the file ``name`` in it, None when there is none."""
        where = self._where(name)
        try:
            fd = os.open(where["path"], _open_flags(follow=False), dir_fd=where.get("dir_fd"))
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _not_ours_or(exc, os.path.join(self.path, name))
        try:
            _check_ours(os.fstat(fd), os.path.join(self.path, name), stat.S_ISREG, "a regular file")
            return _read_open(fd, os.path.join(self.path, name), None, max_size)
        finally:
            os.close(fd)

    def write(self, name: str, data: bytes) -> None:
        """Create or replace the file ``name`` in it: a new file (exclusive, no link followed) renamed
        over it. What is there already must be this user's regular file."""
        where = self._where(name)
        try:
            _check_ours(os.stat(where["path"], dir_fd=where.get("dir_fd"), follow_symlinks=False),
                        os.path.join(self.path, name), stat.S_ISREG, "a regular file")
        except FileNotFoundError:
            pass
        temporary = f".{name}.{secrets.token_hex(8)}.tmp"
        into = self._where(temporary)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
        fd = os.open(into["path"], flags, 0o600, dir_fd=into.get("dir_fd"))
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(into["path"], where["path"], src_dir_fd=into.get("dir_fd"), dst_dir_fd=where.get("dir_fd"))
        except BaseException:
            _remove(into["path"], into.get("dir_fd"))
            raise

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> "PrivateDirectory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _not_ours_or(exc: OSError, path: str) -> OSError:
    """ELOOP (O_NOFOLLOW met a link) as NotOurs; any other error as it is."""
    if exc.errno in (errno.ELOOP, errno.EMLINK):  # EMLINK: FreeBSD's answer to O_NOFOLLOW
        return NotOurs(path, "a symbolic link, not a file preclint made")
    return exc


def _check_ours(info: os.stat_result, path: str, is_kind, kind: str) -> None:
    if stat.S_ISLNK(info.st_mode):
        raise NotOurs(path, "a symbolic link, not a file preclint made")
    if not is_kind(info.st_mode):
        raise NotOurs(path, f"not {kind}")
    if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
        raise NotOurs(path, f"owned by another user (uid {info.st_uid})")
