"""Running the user's code: a time limit, no exiting the process, warnings kept off the terminal, and
the interrupt signals.

Checking a model runs code preclint did not write: importing the file, building the model, its example
inputs, tracing and running it (and the probe's runs). That code may loop forever, call ``sys.exit`` or
``os._exit``, raise ``KeyboardInterrupt``, print to stdout (where the report goes) or raise warnings. :func:`guard` turns each of these into one
:class:`~preclint.core.errors.UserError` naming the model, so the run can still report the other models.

The time limit is an ``ITIMER_REAL`` alarm in the main thread (in another thread, where signals do not
reach, a watchdog thread that raises there through ``PyThreadState_SetAsyncExc``) whose handler raises
:class:`TimeLimitExceeded`, a ``BaseException`` so that the user's ``except Exception`` cannot swallow it
(and again each second, should something swallow it all the same). Code that never returns to the interpreter (one enormous kernel) or that catches ``BaseException`` would
still hold the process, so a watchdog thread ends it ``HARD_STOP_GRACE`` seconds later, after printing
the same line. The processes the code starts end with preclint's run (processes.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Iterator, List, Optional

from preclint.load import interrupts
from preclint.load import processes
from preclint.core.errors import UserError
from preclint.core.exitcodes import EXIT_ERROR

DEFAULT_TIMEOUT = 600.0  # seconds for one model: import, build, capture, reference pass and probe
HARD_STOP_GRACE = 10.0  # seconds the alarm's exception gets to unwind before the process is ended
NO_LIMIT_BEYOND = 1e8  # seconds (three years): a longer limit is no limit (timers overflow near 1e12)
REPEAT_INTERVAL = 1.0  # seconds between repeats of the alarm while the model's code has not stopped

_real_exit = os._exit  # kept before anything can patch it: the watchdog and the signal handlers use it
_real_abort = os.abort


class TimeLimitExceeded(BaseException):
    """Raised in the main thread when the model's time is up (a BaseException: user code catching
    Exception must not swallow it)."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; the CLI exits with 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name


class ProcessExitRefused(BaseException):
    """Raised in place of ``os._exit`` / ``os.abort`` called by the user's code."""

    def __init__(self, call: str) -> None:
        super().__init__(call)
        self.call = call


# ------------------------------------------------------------------------------------------ signals


@contextlib.contextmanager
def interrupt_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`Interrupted` (not KeyboardInterrupt, which user code may raise
    itself); a second signal ends the process at once. Previous handlers come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: List[int] = []

    def handler(signum: int, frame: Optional[FrameType]) -> None:
        if received:  # the first one did not get us out (user code caught it, or a long kernel): stop now
            processes.exit_now(interrupts.say_interrupted(signum))
        received.append(signum)
        raise Interrupted(signum)

    with interrupts.signals_handled_by(handler):
        yield


def end_process(code: int) -> None:
    """End the command's process with ``code``, now that the report is out. The interpreter's own
    ending is skipped: it would run the exit handlers the model's code registered (``atexit``,
    ``weakref.finalize``, a lingering thread's), any of which could end the process with another code
    (``os._exit(0)`` made a run with findings pass) or print after the report, and it would wait for
    the threads the model's code started. preclint's own clean-ups run first (processes.at_end)."""
    processes.run_at_end()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a reader that left, a closed stream: the report is out
            if stream is not None:
                stream.flush()
    _real_exit(code)


# ------------------------------------------------------------------------------------------- guard


@dataclass
class Guarded:
    """What happened while user code ran: the warnings it (or torch) raised, deduplicated."""

    warnings: List[str] = field(default_factory=list)
    user_warnings: List[str] = field(default_factory=list)  # those raised at a line of the user's code


@contextlib.contextmanager
def guard(name: str, timeout: Optional[float]) -> Iterator[Guarded]:
    """Run the body (everything done with one model) under the time limit ``timeout`` (seconds; None
    or 0: no limit), with process exits refused and warnings recorded; user-caused endings become a
    UserError that names ``name``."""
    result = Guarded()
    try:  # around the `with`: the time limit is disarmed before its exception is turned into an error line
        with _process_state_kept(), _warnings_recorded(result), _exits_refused(), _stdout_to_stderr(), \
                processes.user_code_running(), _time_limit(name, timeout):
            yield result
    except TimeLimitExceeded as exc:
        raise UserError(_time_message(name, timeout, exc.args[0] if exc.args else None)) from None
    except ProcessExitRefused as exc:
        raise UserError(f"{name}: the model's code called {exc.call}{_at(exc.__traceback__)}; "
                        "preclint cannot check a model whose code ends the process") from None
    except SystemExit as exc:
        code = "" if exc.code is None else repr(exc.code)
        raise UserError(f"{name}: the model's code called sys.exit({code}){_at(exc.__traceback__)}; "
                        "preclint cannot check a model whose code ends the process") from None
    except (Exception, Interrupted, GeneratorExit):
        raise
    except BaseException as exc:  # KeyboardInterrupt raised by the code itself (a real Ctrl-C arrives as
        # Interrupted), or a BaseException of its own
        text = " ".join(str(exc).split())
        raise UserError(f"{name}: the model's code raised {type(exc).__name__}{': ' + text if text else ''}"
                        f"{_at(exc.__traceback__)}") from None


def _time_message(name: str, timeout: Optional[float], where: Optional[str]) -> str:
    at = f", at {where}" if where else ""
    return (f"{name}: gave up after {timeout:g} s{at} (loading, capturing and running the model must finish "
            "within --timeout SECONDS, or `timeout` in [tool.preclint]; 0 means no limit)")


@contextlib.contextmanager
def _time_limit(name: str, timeout: Optional[float]) -> Iterator[None]:
    if not timeout or timeout >= NO_LIMIT_BEYOND:
        yield
        return
    on_main = threading.current_thread() is threading.main_thread()
    limit = _alarm if on_main and hasattr(signal, "setitimer") else _watched
    fired: List[Optional[str]] = []  # where the user's code was each time the limit struck
    try:
        with limit(name, timeout, fired):
            yield
    except TimeLimitExceeded as exc:
        if exc.args:
            raise
        raise TimeLimitExceeded(next((where for where in fired if where), None)) from None


def _hard_stop(name: str, timeout: float, fired: List[Optional[str]]) -> None:
    where = next((where for where in fired if where), None)
    sys.stderr.write(f"preclint: error: {_time_message(name, timeout, where)}; the model's code did not "
                     f"stop within {HARD_STOP_GRACE:g} s more, so preclint ended without a report\n")
    processes.exit_now(EXIT_ERROR)


@contextlib.contextmanager
def _alarm(name: str, timeout: float, fired: List[Optional[str]]) -> Iterator[None]:
    """The limit in the main thread: SIGALRM, whose handler raises (it also wakes a sleep)."""

    def on_alarm(signum: int, frame: Optional[FrameType]) -> None:
        fired.append(_user_frame_of(frame))
        raise TimeLimitExceeded(next((where for where in fired if where), None))

    watchdog = threading.Timer(timeout + HARD_STOP_GRACE, _hard_stop, (name, timeout, fired))
    watchdog.daemon = True
    previous = signal.signal(signal.SIGALRM, on_alarm)
    # then once a second: an exception swallowed on its way out (an `except BaseException` in the
    # model, a C++ frame that turns it into another error) is raised again
    signal.setitimer(signal.ITIMER_REAL, timeout, REPEAT_INTERVAL)
    watchdog.start()
    try:
        yield
    finally:
        while True:  # an alarm that fires during the clean-up must not leave the timer armed
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, previous)
                watchdog.cancel()
                break
            except TimeLimitExceeded:
                continue


@contextlib.contextmanager
def _process_state_kept() -> Iterator[None]:
    """The working directory and the signal handlers are preclint's again after the model's code:
    an ``os.chdir`` at import must not move where ``-o report.sarif`` lands (nor what the report's
    paths are relative to), and a handler the model installed (SIGTERM doing ``sys.exit(0)``) must not
    decide how a run cancelled later ends. The directory is held open, so that it is the same
    directory even if the model's code renames it."""
    try:
        here: Optional[int] = os.open(".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # a working directory preclint may not open (no read permission): kept by name
        here = None
    cwd = os.getcwd()
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in signal.valid_signals():
            with contextlib.suppress(ValueError, OSError):
                handler = signal.getsignal(signum)
                if handler is not None:  # None: a handler from C, which Python cannot put back
                    handlers[signum] = handler
    try:
        with processes.hidden_from_forks(here) if here is not None else contextlib.nullcontext():
            yield
    finally:
        for signum, handler in handlers.items():
            if signal.getsignal(signum) is not handler:
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(signum, handler)
        try:
            if here is not None:
                os.fchdir(here)
            else:
                os.chdir(cwd)
        except OSError:
            pass
        finally:
            if here is not None:
                os.close(here)


@contextlib.contextmanager
def _watched(name: str, timeout: float, fired: List[Optional[str]]) -> Iterator[None]:
    """The limit in any other thread (signals reach the main thread only; preclint.check called from
    a worker thread, a server, a test runner's thread): a watchdog thread raises TimeLimitExceeded
    in the guarded thread through CPython's PyThreadState_SetAsyncExc, again once a second, and
    ends the process as the alarm's watchdog does. The exception lands when the thread next runs
    Python code, so a sleep or a long kernel finishes first (the alarm interrupts a sleep)."""
    raise_in = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
    if raise_in is None:  # not CPython: no way to interrupt another thread
        raise UserError(f"{name}: a time limit outside the main thread needs CPython; call from the main "
                        "thread, or with no time limit")
    target = ctypes.c_ulong(threading.get_ident())
    lock = threading.Lock()
    armed = [True]
    done = threading.Event()

    def watch() -> None:
        if done.wait(timeout):
            return
        hard_stop_at = time.monotonic() + HARD_STOP_GRACE
        while time.monotonic() < hard_stop_at:
            with lock:
                if not armed[0]:
                    return
                fired.append(_user_frame_of(sys._current_frames().get(target.value)))
                raise_in(target, ctypes.py_object(TimeLimitExceeded))
            if done.wait(min(REPEAT_INTERVAL, max(hard_stop_at - time.monotonic(), 0.0))):
                return
        with lock:
            if armed[0]:
                _hard_stop(name, timeout, fired)

    watchdog = threading.Thread(target=watch, name="preclint-time-limit", daemon=True)
    watchdog.start()
    try:
        yield
    finally:
        while True:  # an exception raised during the clean-up must not leave one pending
            try:
                with lock:
                    armed[0] = False
                done.set()
                raise_in(target, None)  # one set but not yet raised is dropped
                break
            except TimeLimitExceeded:
                continue


@contextlib.contextmanager
def _exits_refused() -> Iterator[None]:
    """``os._exit`` and ``os.abort`` raise instead, in this process; a forked child (a DataLoader
    worker) still exits as it asks."""
    owner = os.getpid()

    def refuse_exit(status: int) -> None:
        if os.getpid() != owner:
            _real_exit(status)
        raise ProcessExitRefused(f"os._exit({status!r})")

    def refuse_abort() -> None:
        if os.getpid() != owner:
            _real_abort()
        raise ProcessExitRefused("os.abort()")

    before = os._exit, os.abort
    os._exit, os.abort = refuse_exit, refuse_abort  # type: ignore[assignment]
    try:
        yield
    finally:
        os._exit, os.abort = before  # type: ignore[assignment]


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """What the model's code prints goes to stderr: stdout carries the report, which may be a JSON or
    SARIF document that one stray line would make invalid. Python's ``print`` and writes to file
    descriptor 1 (C extensions) alike."""
    try:
        sys.stdout.flush()
        redirect_fd = sys.stdout.fileno() == 1 and sys.stderr.fileno() == 2
    except (AttributeError, OSError, ValueError):  # a stdout without a descriptor (captured in tests)
        redirect_fd = False
    saved = None
    if redirect_fd:
        saved = os.dup(1)
        os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr), \
                (processes.hidden_from_forks(saved) if saved is not None else contextlib.nullcontext()):
            yield
    finally:
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)


@contextlib.contextmanager
def _warnings_recorded(result: Guarded) -> Iterator[None]:
    with warnings.catch_warnings(record=True) as caught:
        try:
            yield
        finally:
            _keep_warnings(caught, result)


def _keep_warnings(caught: List[warnings.WarningMessage], result: Guarded) -> None:
    seen = set()
    for w in caught:
        text = f"{_display(w.filename)}:{w.lineno}: {w.category.__name__}: {' '.join(str(w.message).split())}"
        if text in seen:
            continue
        seen.add(text)
        result.warnings.append(text)
        if _is_user_file(w.filename):
            result.user_warnings.append(text)


# ---------------------------------------------------------------------------- where in the user's code

# the standard library, the interpreter's own directories (console scripts in a venv's bin/) and preclint
_NOT_USER = tuple(sorted({os.path.abspath(p) + os.sep for p in (
    sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"], sys.prefix, sys.exec_prefix,
    sys.base_prefix, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))}))  # (preclint/, not capture/)


def _is_user_file(path: str) -> bool:
    if not path or path.startswith("<"):
        return False
    absolute = os.path.abspath(path)
    if absolute.startswith(_NOT_USER):
        return False
    if "torch" in sys.modules:
        from preclint.capture.frames import is_internal_file  # lazy: torch-free path (the command line handles signals with it)

        return not is_internal_file(absolute)
    return f"{os.sep}site-packages{os.sep}" not in absolute


def _display(path: str) -> str:
    if not path or path.startswith("<"):
        return path
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith(os.pardir) else relative


def _user_frame_of(frame: Optional[FrameType]) -> Optional[str]:
    """``file:line`` of the innermost frame of the user's code at or above ``frame``."""
    while frame is not None:
        if _is_user_file(frame.f_code.co_filename):
            return f"{_display(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def _at(tb: Optional[TracebackType]) -> str:
    """`` at file:line`` of the innermost user frame of a traceback, or nothing."""
    where = None
    while tb is not None:
        if _is_user_file(tb.tb_frame.f_code.co_filename):
            where = f"{_display(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return f" at {where}" if where else ""
