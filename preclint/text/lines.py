"""The text of the lines findings point at, for the formats that need it (SARIF regions and
fingerprints, rdjson's byte columns, baselines). Files are read once per process, by printed path."""
from __future__ import annotations

import functools
import os
from typing import List, Optional

from preclint.text.safe_io import read_regular
from preclint.text.sourcefile import ParseFailure, decode


def file_text(path: str) -> Optional[str]:
    """The file's text now: the cache is keyed on size and modification time, so a file that a fix
    (or an editor) rewrote is read again."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return _read(path, info.st_size, info.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _read(path: str, size: int, mtime_ns: int) -> Optional[str]:
    try:
        return decode(read_regular(path))  # never a FIFO: it would block
    except (OSError, ParseFailure):
        return None


def file_lines(path: str) -> List[str]:
    text = file_text(path)
    return _lines(text) if text is not None else []


@functools.lru_cache(maxsize=16)
def _lines(text: str) -> List[str]:
    # split once per text: a report asks for the line of every finding (callers do not modify it)
    return text.splitlines()


def line_text(path: str, line: int) -> Optional[str]:
    lines = file_lines(path)
    return lines[line - 1] if 0 < line <= len(lines) else None


def utf8_column(path: str, line: int, column: int) -> int:
    """A 1-based code-point column as a 1-based UTF-8 byte column (reviewdog's unit)."""
    text = line_text(path, line)
    if text is None:
        return column
    return len(text[: column - 1].encode("utf-8")) + 1


def primary_location_line_hash(path: str, line: int) -> Optional[str]:
    """GitHub code scanning's ``primaryLocationLineHash`` for ``line`` of ``path``, computed the way
    github/codeql-action's upload step computes it, so that the two agree and alerts are matched across
    runs: a rolling hash (multiplier 37, 64-bit wrap-around) over the next 100 characters from the start
    of the line, spaces and tabs skipped, CR and CRLF read as LF, with ``:<n>`` counting earlier lines
    of the same hash."""
    text = file_text(path)
    if text is None:
        return None
    return _line_hashes(text).get(line)


_BLOCK = 100
_MASK = (1 << 64) - 1
_FIRST_MOD = pow(37, _BLOCK, 1 << 64)


@functools.lru_cache(maxsize=64)
def _line_hashes(text: str) -> dict:
    window = [0] * _BLOCK
    starts = [-1] * _BLOCK  # the line number starting at each window slot, or -1
    state = {"hash": 0, "index": 0, "line": 0, "line_start": True, "prev_cr": False}
    counts: dict = {}
    hashes: dict = {}

    def output() -> None:
        value = format(state["hash"], "x")
        counts[value] = counts.get(value, 0) + 1
        hashes[starts[state["index"]]] = f"{value}:{counts[value]}"
        starts[state["index"]] = -1

    def update(current: int) -> None:
        i = state["index"]
        begin = window[i]
        window[i] = current
        state["hash"] = (37 * state["hash"] + current - _FIRST_MOD * begin) & _MASK
        state["index"] = (i + 1) % _BLOCK

    def process(current: int) -> None:
        if current in (0x20, 0x09) or (state["prev_cr"] and current == 0x0A):
            state["prev_cr"] = False
            return
        if current == 0x0D:
            current, state["prev_cr"] = 0x0A, True
        else:
            state["prev_cr"] = False
        if starts[state["index"]] != -1:
            output()
        if state["line_start"]:
            state["line_start"] = False
            state["line"] += 1
            starts[state["index"]] = state["line"]
        if current == 0x0A:
            state["line_start"] = True
        update(current)

    # JavaScript strings are UTF-16: characters outside the BMP count as two code units there
    data = text.encode("utf-16-le", "surrogatepass")
    for i in range(0, len(data), 2):
        process(data[i] | (data[i + 1] << 8))
    process(65535)  # the end-of-file marker
    for _ in range(_BLOCK):
        if starts[state["index"]] != -1:
            output()
        update(0)
    return hashes
