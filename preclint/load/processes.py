"""The processes the model's code starts end with the run.

The model's code runs in preclint's own process, so what it starts (``os.fork``, ``subprocess``,
``multiprocessing``, a DataLoader's workers) are preclint's children. One that outlived preclint would
keep what it inherited open, among it the pipe of ``preclint check model.py | cat``, which then waits
for it whatever ``--timeout`` says (and so does a CI step that waits for every process of its job).

On Linux the command makes preclint a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``) when it
starts, so that a descendant whose parent dies (a double fork, a daemon that calls ``setsid``) is
re-parented to preclint instead of init; before it exits (a report, an error, the time limit, SIGINT
or SIGTERM alike) it sends its descendants, found in /proc, SIGTERM, then SIGKILL after a short grace,
and reaps them, until none is left. Only processes that descend from preclint are ever signalled.
Process groups were not used: a shell puts ``preclint | cat`` in one group, so ending the group would
end ``cat``; a group of preclint's own would take it out of the terminal's foreground group (Ctrl-C
would no longer reach it); and a child leaves any group with ``setsid()``.

Elsewhere (no /proc, no subreaper) the descendants are not found and are left alone. What a child
forked from the model's code holds of preclint's own is let go everywhere: preclint's saved copy of
stdout (the report's pipe) is closed in the child, and its SIGINT and SIGTERM handlers are the
defaults again (with preclint's, a child told to stop would unwind through preclint's code and say
"preclint: interrupted").
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from typing import AbstractSet, Callable, Dict, Iterator, List, Optional, Set

GRACE = 1.0  # seconds between SIGTERM and SIGKILL
GIVE_UP = 5.0  # seconds after SIGKILL: processes that keep forking faster than they are ended are left
_POLL = 0.01  # seconds between looks at /proc while descendants are ending
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_ON_LINUX = sys.platform.startswith("linux")  # /proc/PID/stat as Linux writes it

_real_exit = os._exit  # kept before the model's code can patch it
_owner: Optional[int] = None  # the process whose descendants end with it (the command's)
_spared: Set[int] = set()  # its descendants from before, and theirs: not the model's
_hidden_fds: Set[int] = set()  # preclint's own descriptors, closed in a child forked from the model's code
_user_code_depth = 0
_at_end: List[Callable[[], None]] = []  # preclint's own clean-ups, run before the command's process ends


def at_end(cleanup: Callable[[], None]) -> None:
    """Run ``cleanup`` when the command ends its process (``run_at_end``): the command ends it without
    the interpreter's exit handlers (capture/usercode.py, end_process), so ``atexit`` would not."""
    _at_end.append(cleanup)


def run_at_end() -> None:
    """preclint's clean-ups, the last registered first; one that fails does not stop the others."""
    while _at_end:
        with contextlib.suppress(Exception):
            _at_end.pop()()


def take_charge() -> None:
    """Make this process the one whose descendants end with it (the CLI calls it once, at its start;
    a program that imports preclint keeps its children to itself)."""
    global _owner, _spared
    if _owner is None:
        os.register_at_fork(after_in_child=_let_go_in_child)
    _owner = os.getpid()
    _spared = set(_descendants(_owner)) if _ON_LINUX else set()
    if _ON_LINUX:
        try:
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl here: orphans go to init, the children are still ended
            pass


def end_descendants(grace: float = GRACE) -> None:
    """SIGTERM to every living descendant of this process, SIGKILL to those still there ``grace``
    seconds later, each reaped; returns when none is left (or GIVE_UP seconds after the SIGKILL)."""
    if _owner is None or _owner != os.getpid() or not _ON_LINUX:
        return
    kill_at = time.monotonic() + grace
    signalled: Dict[int, int] = {}
    while True:
        _reap()
        descendants = _descendants(_owner, _spared)
        now = time.monotonic()
        if not descendants or now > kill_at + GIVE_UP:
            _reap()  # those that ended since the last look
            return
        signum = signal.SIGKILL if now >= kill_at else signal.SIGTERM
        for pid in descendants:
            if signalled.get(pid) == signum:
                continue
            signalled[pid] = signum
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
                if signum == signal.SIGTERM:
                    os.kill(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once it runs
        time.sleep(_POLL)


def exit_now(code: int) -> None:
    """End this process with ``code`` at once, its descendants first (SIGKILL: no grace)."""
    with contextlib.suppress(Exception):  # in a signal handler a flush can be a reentrant call
        sys.stderr.flush()
    end_descendants(grace=0.0)
    run_at_end()
    _real_exit(code)


@contextlib.contextmanager
def user_code_running() -> Iterator[None]:
    """Children forked in the block (by the model's code) let go of what is preclint's, and one that
    comes back out of the block (a fork that did not exit) ends there, quietly: it would otherwise go
    on to check the model, and print the report, a second time."""
    global _user_code_depth
    pid = os.getpid()
    _user_code_depth += 1
    try:
        yield
    finally:
        _user_code_depth -= 1
        if os.getpid() != pid:
            _real_exit(0)  # unflushed: its buffers are copies of preclint's


@contextlib.contextmanager
def hidden_from_forks(fd: int) -> Iterator[None]:
    """``fd`` (preclint's own, such as its saved stdout) is closed in a child forked in the block."""
    _hidden_fds.add(fd)
    try:
        yield
    finally:
        _hidden_fds.discard(fd)


def _let_go_in_child() -> None:
    if not _user_code_depth:
        return
    for fd in list(_hidden_fds):
        with contextlib.suppress(OSError):
            os.close(fd)
    _hidden_fds.clear()
    for signum, handler in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, signal.SIG_DFL)):
        with contextlib.suppress(ValueError, OSError):
            signal.signal(signum, handler)


def _reap() -> None:
    """Collect the exit status of every child that has ended (those re-parented to preclint too)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants(root: int, spared: AbstractSet[int] = frozenset()) -> List[int]:
    """The living (not zombie) descendants of ``root`` but those in ``spared`` and theirs, from one
    pass over /proc."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # ended meanwhile
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so read after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) < 2 or fields[0] in (b"Z", b"X") or not fields[1].isdigit():
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
    found: Set[int] = set()
    pending = list(children.get(root, []))
    while pending:
        pid = pending.pop()
        if pid != root and pid not in found and pid not in spared:
            found.add(pid)
            pending.extend(children.get(pid, []))
    return sorted(found)
