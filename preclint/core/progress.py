"""Progress bars on stderr for long work: the reference pass, the probe's stages, a plan's runs.

A bar appears only where a person watches: stderr is a terminal, not in CI, not with --quiet, and
only once the work has taken ``DELAY`` seconds (short runs print nothing extra). It is transient: it
disappears when the work ends, so what is left on the screen is the report. Off unless the CLI
turns it on, so library callers and tests see nothing.

    with task("reference pass") as bar:      # total=None: a count and a pulsing bar
        for node in nodes:
            bar.advance()
"""
from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional

DELAY = 2.0  # seconds of work before a bar is worth showing
_enabled = False


def wanted(quiet: bool) -> bool:
    """Whether a person watches stderr: a terminal, outside CI, without --quiet."""
    if quiet or os.environ.get("CI", "").lower() not in ("", "0", "false") or os.environ.get("TERM") == "dumb":
        return False
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):
        return False


def enable(on: bool) -> None:
    global _enabled
    _enabled = on


class Bar:
    """One piece of work. ``advance`` and ``describe`` are cheap and safe to call from the work's
    thread while the display refreshes from its own."""

    def __init__(self, description: str, total: Optional[float]) -> None:
        self.description = description
        self.total = total
        self.completed = 0.0
        self._progress = None
        self._task = None
        self._lock = threading.Lock()
        self._closed = False

    def advance(self, amount: float = 1.0) -> None:
        self.completed += amount
        if self._progress is not None:
            self._progress.update(self._task, completed=self.completed)

    def set_total(self, total: Optional[float]) -> None:
        self.total = total
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def describe(self, description: str) -> None:
        self.description = description
        if self._progress is not None:
            self._progress.update(self._task, description=description)

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn,
                                   TimeElapsedColumn)

        with self._lock:
            if self._progress is not None or self._closed:  # the work ended as the timer fired
                return
            columns = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                       MofNCompleteColumn() if self.total else TextColumn("{task.completed:.0f}"), TimeElapsedColumn()]
            progress = Progress(*columns, console=Console(file=sys.stderr), transient=True)
            self._task = progress.add_task(self.description, total=self.total, completed=self.completed)
            try:
                progress.start()
            except Exception:  # another live display holds the terminal: the work goes on without a bar
                return
            self._progress = progress

    def _close(self) -> None:
        with self._lock:
            self._closed = True
            if self._progress is not None:
                self._progress.stop()
                self._progress = None


@contextmanager
def task(description: str, total: Optional[float] = None) -> Iterator[Bar]:
    """A bar for the work inside the block, shown after ``DELAY`` seconds where progress is enabled."""
    bar = Bar(description, total)
    if not _enabled:
        yield bar
        return
    if DELAY <= 0:  # at once, not from a timer thread that the work may outrun
        bar._show()
        try:
            yield bar
        finally:
            bar._close()
        return
    timer = threading.Timer(DELAY, bar._show)
    timer.daemon = True
    timer.start()
    try:
        yield bar
    finally:
        timer.cancel()
        bar._close()
