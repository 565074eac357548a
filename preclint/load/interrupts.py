"""Interrupts held back while an import must not be cut short, and the one exit status for them.

An import interrupted halfway cannot always be done again in the same process: numpy (which torch
imports) refuses to initialise its C extension twice ("cannot load module more than once per
process"), so a SIGINT that lands during ``import torch`` would break every later import of it. Inside
:func:`interrupts_deferred`, SIGINT and SIGTERM are recorded and delivered when the body is done, to
the handler that was in place (``KeyboardInterrupt`` by default, preclint's ``Interrupted`` under the
CLI); a second one ends the process at once, as under the CLI's own handler.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Dict, Iterator, List

from preclint.load.processes import exit_now


def exit_status(signum: int) -> int:
    """The shell's convention for a process ended by a signal: 128 + its number (SIGINT 130)."""
    return 128 + signum


def say_interrupted(signum: int) -> int:
    """The one line preclint prints when interrupted; returns the exit status."""
    sys.stderr.write(f"preclint: interrupted ({signal.Signals(signum).name})\n")
    sys.stderr.flush()
    return exit_status(signum)


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the body is done, then are delivered (see the module's text)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signals are handled in the main thread only
        return
    received: List[int] = []

    def hold(signum: int, frame: object) -> None:
        if received:  # asked twice: the import is taking too long for the user
            exit_now(say_interrupted(signum))
        received.append(signum)

    previous: Dict[int, object] = {}
    try:
        with signals_handled_by(hold) as previous:
            yield
    finally:  # the previous handlers are back: the held signal goes to the one the body found
        if received:
            _deliver(received[0], previous.get(received[0]))


@contextlib.contextmanager
def signals_handled_by(handler: Callable[[int, object], None]) -> Iterator[Dict[int, object]]:
    """SIGINT and SIGTERM go to ``handler`` inside the block; it receives the handlers they had, which
    come back after it."""
    previous: Dict[int, object] = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[signum] = signal.signal(signum, handler)
        except (ValueError, OSError):  # not settable here (embedded interpreters)
            pass
    try:
        yield previous
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _deliver(signum: int, handler: object) -> None:
    if callable(handler):
        handler(signum, None)  # raises: KeyboardInterrupt (Python's handler), Interrupted (the CLI's)
    elif handler == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:  # the default action of SIGTERM: end the process, as it would have
        os.kill(os.getpid(), signum)
