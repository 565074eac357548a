"""Where a run's outputs go, and writing them safely: the report on stdout or in ``--output``, the
baseline of ``--write-baseline``. An output never replaces an input of the same run (the baseline, the
configuration, the weights, a checked file), never writes through a link, and a regular file is
replaced whole or left as it was."""
from __future__ import annotations

import codecs
import errno
import os
import stat
import sys
from typing import Dict, Optional, Sequence, TextIO, Tuple

from preclint.core.errors import UserError
from preclint.report.formats import document_formats
from preclint.text.no_links import LinkOnPath, at, link_on_path, open_parent
from preclint.text.safe_io import write_atomic_at

Inputs = Sequence[Tuple[Optional[str], str]]  # (a file the run reads, what it is)

# where each output checked so far goes, fixed when it was checked (before any model's code ran): the
# working directory then (the kernel's path, without links) joined with the name as given, so that an
# os.chdir of the model's code (a thread it left running) does not move the report
_PLACES: Dict[str, str] = {}

# Formats that are documents in an encoding of their own: JSON is UTF-8 (RFC 8259), the JUnit XML and
# the HTML page declare UTF-8. Printed on a stdout of another encoding (a redirected stdout on Windows
# is cp1252), they are still written as UTF-8, the same bytes as --output writes.
DOCUMENT_FORMATS = document_formats()  # json, sarif, rdjson, gitlab, junit, html: each format says (DOCUMENT)
# what else is written as UTF-8 on any stdout: the unified diff of --diff, a patch for git apply, whose
# lines must stay the files' text
OTHER_UTF8_OUTPUTS = frozenset({"diff"})
# the error handler that writes what an encoding cannot hold as JSON's \uXXXX escapes (a surrogate
# pair beyond the BMP): valid in a JSON or JavaScript string, plain ASCII text in XML and HTML
JSON_ESCAPE = "preclint.json-escape"


def _json_escape(error: UnicodeError):
    if not isinstance(error, UnicodeEncodeError):
        raise error
    out = []
    for char in error.object[error.start:error.end]:
        code = ord(char)
        if code > 0xFFFF:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
        else:
            out.append(f"\\u{code:04x}")
    return "".join(out), error.end


codecs.register_error(JSON_ESCAPE, _json_escape)


def encode_output(text: str, encoding: str = "utf-8") -> bytes:
    """``text`` in ``encoding``, what it cannot hold (a lone surrogate: a name that is not UTF-8; a
    character the encoding lacks) written as JSON's ``\\uXXXX`` escapes, so that no name can make an
    output fail to be written."""
    return text.encode(encoding, JSON_ESCAPE)


def run_inputs(args, config_path: Optional[str]) -> Inputs:
    """The files a run of the parsed command line ``args`` reads (or writes) besides the checked
    paths, which no other output of the run may replace."""
    return [(getattr(args, "baseline", None), "the baseline this run reads (--baseline)"),
            (getattr(args, "write_baseline", None), "where this run writes its baseline (--write-baseline)"),
            (getattr(args, "weights", None), "the weights file this run loads (--weights)"),
            (getattr(args, "policy", None), "the policy this run reads (--policy)"),
            (config_path, "the configuration this run reads")]


def report_destination(output: Optional[str], fmt: str, checked: Sequence[str] = (), inputs: Inputs = ()) -> Optional[str]:
    """The file ``--output`` names for the report, checked before any model runs, or None for stdout
    (no --output, or ``-``). An HTML page is not printed on a terminal. ``inputs``: the other files
    the run reads, which the report must not replace (see ``check_output_target``)."""
    if output == "-":
        return None
    if output is not None:
        if not output:
            raise UserError("--output needs a file name (or - for stdout)")
        check_output_target(output, "report", checked=checked, inputs=inputs)
        return output
    if fmt == "html" and sys.stdout is not None and sys.stdout.isatty():
        raise UserError("--output-format html makes a page for a browser: write it to a file with --output FILE")
    return None


def check_output_target(filename: str, what: str = "baseline", checked: Sequence[str] = (), inputs: Inputs = ()) -> None:
    """Fail early (before any model runs) on a target the file cannot be written to: a directory, a
    missing directory, a Python file or one of the ``checked`` files (the user's code, which a
    misplaced argument would replace), another input of the run (``inputs``: the baseline it reads,
    its configuration, a weights file), a link ``write_output_file`` will not write through, or the
    report's own stdout (``/dev/stdout``, ``-``, the file stdout is redirected to), where the two would
    be mixed into one invalid document."""
    if filename in ("", "-"):
        raise UserError(f"--write-{what} {filename!r}: the report is printed on stdout; name a file for the {what}")
    if os.path.isdir(filename):
        raise UserError(f"{filename}: is a directory; name a file for the {what}")
    if not os.path.isdir(os.path.dirname(os.path.abspath(filename))):
        raise UserError(f"{filename}: the directory does not exist")
    if os.path.isfile(filename) and (filename.endswith((".py", ".pyi")) or any(
            os.path.isfile(path) and os.path.samefile(path, filename) for path in checked)):
        raise UserError(f"{filename}: is code preclint checks, not a {what}; name another file for the {what}")
    for path, role in inputs:
        if path and _same_file(path, filename):
            raise UserError(f"{filename}: is {role}; write the {what} to another file")
    try:
        target, stdout = os.stat(filename), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file yet, or no real stdout (tests)
        target = stdout = None
    if target is not None and (target.st_dev, target.st_ino) == (stdout.st_dev, stdout.st_ino):
        raise UserError(f"{filename}: is where the report goes (stdout); write the {what} to another file")
    link = link_on_path(filename)
    if link is not None:
        raise UserError(LinkOnPath(filename, link).refusal(what))
    _refuse_unsafe_target(filename, what)
    _PLACES[filename] = filename if os.path.isabs(filename) else os.path.join(os.getcwd(), filename)


def _same_file(a: str, b: str) -> bool:
    """Whether the paths name one file: the same inode (hard links, links), or the same place for a
    file that does not exist yet (two outputs of one run)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        first, second = os.stat(a), os.stat(b)
    except (OSError, ValueError):
        return False
    return (first.st_dev, first.st_ino) == (second.st_dev, second.st_ino)


def _refuse_unsafe_target(filename: str, what: str, parent: Optional[int] = None,
                          name: Optional[str] = None) -> Optional[os.stat_result]:
    """What ``filename`` (``name`` in the open directory ``parent``, where given) is (lstat), None when
    there is nothing yet; a UserError for what the file must not be written to. A link is followed only to a stream: a FIFO (``>(cat)``, ``/dev/stdout``
    on a pipe), a terminal or the null device. A link to anything else is refused, since a checked-out
    repository can commit ``report.sarif -> ~/.bashrc`` (or ``-> /dev/sda``) where CI writes its report.
    A block device is never written to."""
    where = {"path": filename} if name is None else {"path": name, **at(parent)}
    try:
        info = os.stat(**where, follow_symlinks=False)
    except FileNotFoundError:
        return None
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.stat(**where)
        except OSError:
            raise UserError(f"{filename}: is a symbolic link to nothing; name a file for the {what}") from None
        if not _stream_device(target):
            raise UserError(f"{filename}: is a symbolic link; preclint does not write the {what} through links "
                            "(a repository can aim one at any file): name the file itself") from None
        return target
    if stat.S_ISBLK(info.st_mode):
        raise UserError(f"{filename}: is a block device; name a file for the {what}")
    return info


# Linux's terminal majors: tty0-63 and serial ports, /dev/tty and the console, pseudo-terminals
_TERMINAL_MAJORS = frozenset([4, 5, *range(136, 144)])


def _stream_device(info: os.stat_result) -> bool:
    """A target a link may lead the report to: a FIFO or socket, the null device, a terminal."""
    if stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return True
    if not stat.S_ISCHR(info.st_mode):
        return False
    try:
        if info.st_rdev == os.stat(os.devnull).st_rdev:
            return True
    except OSError:
        pass
    return sys.platform.startswith("linux") and os.major(info.st_rdev) in _TERMINAL_MAJORS


def write_output_file(filename: str, text: str, what: str) -> None:
    """Write ``text`` to ``filename`` without ever losing what is there or writing through a link: a
    regular file is replaced atomically, keeping its mode and owner; a new file is created; a FIFO or
    a device (``/dev/null``, a pipe another process reads, a link to one) is written to as a stream;
    a directory, a block device, a link to a file and a link anywhere on the way (each directory is
    opened without following links, text/no_links.py) are refused. A name checked before
    (``check_output_target``) is written where it named then, whatever the working directory is now.
    Every failure is a UserError that says the file was left as it was."""
    data = encode_output(text)
    parent = None
    place = _PLACES.pop(filename, filename)
    try:
        parent, name = open_parent(place)
        info = _refuse_unsafe_target(filename, what, parent, name)
        if info is None:
            _create(parent, name, data)
        elif stat.S_ISDIR(info.st_mode):
            raise UserError(f"{filename}: is a directory; name a file for the {what}")
        elif stat.S_ISREG(info.st_mode):
            write_atomic_at(parent, name, data)
        else:
            _stream(parent, name, data)
    except LinkOnPath as exc:
        anchor = place[:len(place) - len(filename)]  # the working directory the name was fixed in
        link = exc.link[len(anchor):] if place != filename and exc.link.startswith(anchor) else exc.link
        raise UserError(LinkOnPath(filename, link).refusal(what)) from None
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENXIO:  # opening a FIFO for writing without blocking, and nobody reads it
            reason = "no process is reading the FIFO"
        raise UserError(f"{filename}: cannot write the {what}: {reason}") from None
    finally:
        if parent is not None:
            os.close(parent)


def _create(parent: Optional[int], name: str, data: bytes) -> None:
    # exclusive, no link followed: a file or link that appeared meanwhile is not overwritten
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    with os.fdopen(os.open(name, flags, 0o666, **at(parent)), "wb") as out:
        try:
            out.write(data)
            out.flush()
        except OSError:
            out.close()
            os.unlink(name, **at(parent))
            raise


def _stream(parent: Optional[int], name: str, data: bytes) -> None:
    # O_NONBLOCK only for the open: a FIFO nobody reads fails at once (ENXIO) instead of hanging
    fd = os.open(name, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0), **at(parent))
    try:
        if not (_stream_device(os.fstat(fd)) or stat.S_ISCHR(os.fstat(fd).st_mode)):  # swapped since it was checked
            raise OSError(errno.EINVAL, "it changed into a file or a link to one meanwhile; nothing was written")
        os.set_blocking(fd, True)
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
    finally:
        os.close(fd)


def write_report(text: str, out: Optional[TextIO] = None, fmt: Optional[str] = None) -> None:
    """Print the report (in the output format ``fmt``) on ``out`` (stdout) and flush it, so that a
    stdout that cannot take it (closed, a full disk) is one error line rather than a traceback at exit.
    A reader that went away (``| head``) raises BrokenPipeError, which the CLI ends quietly.

    Whatever stdout's encoding: a document format (``DOCUMENT_FORMATS``) is written as UTF-8 bytes,
    the encoding it declares, and so is a patch (``fmt="diff"``); text (the console formats, a diff, a rule's page) has what the stream
    cannot hold written as backslash escapes (``\\u6a21``), as Python writes stderr."""
    out = out or sys.stdout
    if out is None:
        raise UserError("stdout is closed: there is nowhere to print the report")
    try:
        _write(out, text, fmt in OTHER_UTF8_OUTPUTS or fmt in document_formats())
        out.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise UserError(f"cannot print the report on stdout: {exc.strerror or exc}") from None


def _write(out: TextIO, text: str, document: bool) -> None:
    encoding = getattr(out, "encoding", None)
    if not encoding:  # a stream of text alone (io.StringIO): it holds any string
        out.write(text)
        return
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        pass
    except LookupError:  # an encoding Python does not know: nothing to compare with
        out.write(text)
        return
    else:
        out.write(text)
        return
    buffer = getattr(out, "buffer", None)
    if document and buffer is not None:
        out.flush()  # what the text layer holds goes first
        buffer.write(encode_output(text))
        buffer.flush()
        return
    errors = JSON_ESCAPE if document else "backslashreplace"
    out.write(text.encode(encoding, errors).decode(encoding))
