"""How load's messages name things: the user's exception on one line, located in the user's file,
paths as the user gave them, lists cut short."""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any, Iterator, Optional

from preclint.core.errors import UserError
from preclint.load.downloads import DownloadRefused
from preclint.text.paths import display_path

# Messages quote user exceptions; they are cut so the line stays readable.
_MAX_QUOTED_CHARS = 240


def check_is_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"no such {what}: {path}")
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory, expected a {what}")
    if not os.path.isfile(path):  # a FIFO or a device (or a link to one): reading it would block or never end
        raise UserError(f"{path}: not a regular file, expected a {what}")


def path_label(path: str) -> str:
    """Relative to the working directory when inside it, else absolute."""

    return display_path(path, inside_only=True)


def located(label: str, abs_path: Optional[str], tb: Optional[TracebackType]) -> str:
    """``label:line`` of the innermost traceback frame in the user's file, else just ``label``."""
    if abs_path is None:
        return label
    line = None
    for frame, lineno in _walk_traceback(tb):
        if os.path.abspath(frame.f_code.co_filename) == abs_path:
            line = lineno
    return f"{label}:{line}" if line is not None else label


def _walk_traceback(tb: Optional[TracebackType]) -> Iterator[tuple[Any, int]]:
    while tb is not None:
        yield tb.tb_frame, tb.tb_lineno
        tb = tb.tb_next


def quote(exc: BaseException) -> str:
    """``Type: message`` on one line, shortened; the user's exception as they would recognise it."""
    if isinstance(exc, DownloadRefused):
        return str(exc)
    message = " ".join(str(exc).split())
    if len(message) > _MAX_QUOTED_CHARS:
        message = message[: _MAX_QUOTED_CHARS - 1].rstrip() + "…"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def quoted_list(names: list[str]) -> str:
    return ", ".join(repr(name) for name in names)


def first_few(items: list[str], limit: int = 3) -> str:
    shown = ", ".join(items[:limit])
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return f"{shown}{more}"
