"""Baselines: adopt preclint on existing code by accepting today's findings and failing only on new ones.

``--write-baseline FILE`` records the findings of a run; ``--baseline FILE`` drops the findings that
match a record. A record is keyed on the path, the code, and a fingerprint of what the finding is
about — the text of its line with whitespace normalised, plus the module and op of a graph finding —
never on the line number, so code that moves up or down keeps matching. A graph finding on a line of
an installed library (``torchvision/models/resnet.py``, a path the same on every machine) is keyed
without that line's text, which changes with the library's version. Records carry a count: two
identical lines with the same finding need two records, and a third copy is new.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
import sys
from collections import Counter
from typing import Iterable, List, Optional, Sequence, Tuple

from preclint.core.errors import UserError
from preclint.core.findings import Finding
from preclint.text.lines import line_text

FORMAT = "preclint-baseline"
VERSION = 1


def _normalised_line(finding: Finding) -> str:
    # a library's line (torchvision's) is keyed by its path, module and op: its text changes with the
    # library's version, not with the user's code
    if finding.location is None or finding.location.library:
        return ""
    text = line_text(finding.location.path, finding.location.line)
    return " ".join((text or "").split())


def fingerprint(finding: Finding) -> str:
    parts = [finding.code, _normalised_line(finding), finding.module, finding.op]
    if finding.location is None and not finding.module and not finding.op:
        parts.append(finding.name)  # a model-level finding: one per code and model
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


def finding_key(finding: Finding) -> Tuple[str, str, str]:
    """What a baseline knows a finding by: its file, its code and its fingerprint."""
    path = finding.location.path if finding.location is not None else ""
    return path, finding.code, fingerprint(finding)


def write_baseline(findings: Iterable[Finding], filename: str) -> int:
    """Record ``findings`` in ``filename``; returns how many were recorded."""
    findings = list(findings)
    counts = Counter(finding_key(f) for f in findings)
    lines = {}
    for f in findings:
        lines.setdefault(finding_key(f), _normalised_line(f) or f.module or f.name)
    records = [
        {"path": path, "code": code, "fingerprint": fp, "count": counts[(path, code, fp)], "text": lines[(path, code, fp)]}
        for path, code, fp in sorted(counts)
    ]
    document = {"format": FORMAT, "version": VERSION, "findings": records}
    write_output_file(filename, json.dumps(document, indent=2, ensure_ascii=False) + "\n", "baseline")
    return len(findings)


def report_destination(output: Optional[str], fmt: str, checked: Sequence[str] = ()) -> Optional[str]:
    """The file ``--output`` names for the report, checked before any model runs, or None for stdout
    (no --output, or ``-``). An HTML page is not printed on a terminal."""
    if output == "-":
        return None
    if output is not None:
        if not output:
            raise UserError("--output needs a file name (or - for stdout)")
        check_output_target(output, "report", checked=checked)
        return output
    if fmt == "html" and sys.stdout is not None and sys.stdout.isatty():
        raise UserError("--output-format html makes a page for a browser: write it to a file with --output FILE")
    return None


def check_output_target(filename: str, what: str = "baseline", checked: Sequence[str] = ()) -> None:
    """Fail early (before any model runs) on a target the file cannot be written to: a directory, a
    missing directory, a Python file or one of the ``checked`` files (the user's code, which a
    misplaced argument would replace), or the report's own stdout (``/dev/stdout``, ``-``, the file
    stdout is redirected to), where the two would be mixed into one invalid document."""
    if filename in ("", "-"):
        raise UserError(f"--write-{what} {filename!r}: the report is printed on stdout; name a file for the {what}")
    if os.path.isdir(filename):
        raise UserError(f"{filename}: is a directory; name a file for the {what}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(filename))):
        raise UserError(f"{filename}: the directory does not exist")
    if os.path.isfile(filename) and (filename.endswith((".py", ".pyi")) or any(
            os.path.isfile(path) and os.path.samefile(path, filename) for path in checked)):
        raise UserError(f"{filename}: is code preclint checks, not a {what}; name another file for the {what}")
    try:
        target, stdout = os.stat(filename), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file yet, or no real stdout (tests)
        return
    if (target.st_dev, target.st_ino) == (stdout.st_dev, stdout.st_ino):
        raise UserError(f"{filename}: is where the report goes (stdout); write the {what} to another file")


def write_output_file(filename: str, text: str, what: str) -> None:
    """Write ``text`` to ``filename`` without ever losing what is there: a regular file (or the one a
    symlink names) is replaced atomically, keeping its mode and owner; a new file is created; a
    device, FIFO or socket is written to as a stream (``/dev/null``, a pipe another process reads);
    a directory is refused. Every failure is a UserError that says the file was left as it was."""
    data = text.encode("utf-8")
    try:
        try:
            info = os.stat(filename)
        except FileNotFoundError:
            _create(filename, data)
            return
        if stat.S_ISDIR(info.st_mode):
            raise UserError(f"{filename}: is a directory; name a file for the {what}")
        if stat.S_ISREG(info.st_mode):
            from preclint.text.safe_io import write_atomic

            write_atomic(filename, text)
        else:
            _stream(filename, data)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENXIO:  # opening a FIFO for writing without blocking, and nobody reads it
            reason = "no process is reading the FIFO"
        raise UserError(f"{filename}: cannot write the {what}: {reason}") from None


def _create(filename: str, data: bytes) -> None:
    with open(filename, "xb") as out:  # exclusive: a file that appeared meanwhile is not overwritten
        try:
            out.write(data)
            out.flush()
        except OSError:
            out.close()
            os.unlink(filename)
            raise


def _stream(filename: str, data: bytes) -> None:
    # O_NONBLOCK only for the open: a FIFO nobody reads fails at once (ENXIO) instead of hanging
    fd = os.open(filename, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    try:
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def read_baseline(filename: str) -> Counter:
    try:
        with open(filename, encoding="utf-8") as handle:
            document = json.load(handle)
    except OSError as exc:
        raise UserError(f"{filename}: cannot read the baseline: {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(f"{filename}: not a preclint baseline (invalid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise UserError(f"{filename}: not a preclint baseline (write one with --write-baseline)")
    if document.get("version") != VERSION:
        raise UserError(f"{filename}: baseline version {document.get('version')!r} is not supported (expected {VERSION})")
    records = document.get("findings")
    if not isinstance(records, list):
        raise UserError(f"{filename}: not a preclint baseline (its findings are not a list)")
    counts: Counter = Counter()
    for number, record in enumerate(records, 1):
        counts[_record_key(record, filename, number)] += _record_count(record, filename, number)
    return counts


def _record_key(record, filename: str, number: int) -> Tuple[str, str, str]:
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("path", "code", "fingerprint")):
        raise UserError(f"{filename}: baseline record {number} lacks path, code or fingerprint")
    return record["path"], record["code"], record["fingerprint"]


def _record_count(record: dict, filename: str, number: int) -> int:
    count = record.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UserError(f"{filename}: baseline record {number} has count {count!r}; expected a whole number >= 1")
    return count


def filter_baseline(findings: Iterable[Finding], filename: str) -> Tuple[List[Finding], int]:
    """(findings not in the baseline, number of baseline records that matched nothing: fixed since)."""
    remaining = read_baseline(filename)
    kept = []
    for finding in sorted(findings, key=Finding.sort_key):
        key = finding_key(finding)
        if remaining[key] > 0:
            remaining[key] -= 1
        else:
            kept.append(finding)
    stale = sum(count for count in remaining.values() if count > 0)
    return kept, stale
