"""The oracle of the attack family (benchmarks.fuzz.attacks): what a hostile repository, file name,
model, cache or checkpoint must not make preclint do, judged from the outputs of one run.

A run fails when it shows any of these (the failure's class first):

- ``injection``: a line of stdout or stderr that a GitHub runner would take as a workflow command
  (``::cmd ...::`` or the legacy ``##[cmd]``, after leading white space, lines split at CR and LF as
  the runner splits them) other than an annotation preclint itself writes in ``--output-format
  github``: ``::error|warning|notice`` with ``file=,line=,col=`` properties escaped as @actions/core
  escapes them and ``title=preclint`` or ``title=preclint (PCLnnn)``, its message escaped; or any line
  that begins with what follows a line break inside a hostile name (a name can mimic preclint's own
  annotation: it is then caught by where it begins);
- ``control-chars``: a C0 or C1 control (ESC and CSI among them; tab and line feed allowed), DEL, or
  a bidirectional override or isolate in text output (full, concise, github) or on stderr;
- ``markup-eaten``: a hostile name holding console markup (``[bold]``, ``[md](https://..)``,
  ``:smile:``) that does not appear as written where the report names it;
- ``live-html``: in an HTML report, a tag or event attribute made of a hostile name (an ``<a>``, a
  ``<script>``, ``onerror=``), or a chart label holding the pseudo-HTML that plotly draws (``<a
  href>`` becomes a live link);
- ``sarif-uri``: a SARIF ``artifactLocation.uri`` with characters a URI must percent-encode;
- ``memory``: a run that ran out of the memory it was given (``MemoryError``, ``std::bad_alloc``,
  killed) or used more than most of it;
- ``hang``: no end within the wall-clock limit; ``held-stdout``: stdout or stderr still open after
  preclint ended (a process the model started holds them: ``preclint check m.py | cat`` waits);
- ``crash``, ``invalid-document``, ``user-error``: as in benchmarks.fuzz.oracle;
- ``exit-status``: an exit status other than the case expects.

The checks of one class of attack (a victim file changed, findings that differ from the truth, a
child process alive after the run, a missing note) are in benchmarks.fuzz.attacks.
"""
from __future__ import annotations

import json
import os
import re
import resource
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Collection, Dict, Iterable, List, Optional, Sequence, Tuple

from benchmarks.fuzz.oracle import ROOT, Run, Verdict, document_problem, judge

TEXT_FORMATS = ("full", "concise", "github")

# ------------------------------------------------------------------------------------ running


@dataclass
class LimitedRun(Run):
    cpu: float = 0.0  # user + system seconds of the preclint process
    max_rss_mb: float = 0.0
    held_open: float = 0.0  # seconds stdout/stderr stayed open after preclint ended (the grace, if never closed)
    memory_mb: int = 0  # the limit it ran under
    pid: int = 0  # its pid, the id of its process group
    stdout_bytes: bytes = b""  # stdout as written (``stdout`` is it decoded as UTF-8, errors replaced)


def _limits(memory_mb: int):
    def apply() -> None:  # in the child, before exec
        limit = memory_mb << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def run_limited(argv: Sequence[str], cwd: str, *, timeout: float = 120.0, memory_mb: int = 2048,
                env: Optional[Dict[str, str]] = None, grace: float = 3.0, end_group: bool = True) -> LimitedRun:
    """``python -m preclint ARGV`` in ``cwd`` (the preclint of $PRECLINT_FUZZ_TARGET, else this
    checkout), in a session of its own, its data segment limited to ``memory_mb`` (RLIMIT_DATA: torch
    maps far more address space than it touches, so RLIMIT_AS would refuse its import); killed with its
    process group past ``timeout`` seconds of wall clock. stdout and stderr are read until they close;
    a pipe still open ``grace`` seconds after preclint ended is given up on (``held_open``). With
    ``end_group``, what it left in its process group is killed afterwards; without, the caller looks
    at it first (and ends it)."""
    # PRECLINT_FUZZ_TARGET: another checkout whose preclint is tried (a "before" run), this one by default
    target = os.environ.get("PRECLINT_FUZZ_TARGET") or str(ROOT)
    environment = {**os.environ, "PYTHONPATH": target, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                   **(env or {})}
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "preclint", *argv], cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environment,
                            start_new_session=True, preexec_fn=_limits(memory_mb))
    streams = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    open_fds = set(streams)
    status = usage = None
    ended = 0.0
    timed_out = False
    peak_kb = 0  # the child's own high-water mark, sampled (see _high_water_kb)
    while True:
        now = time.monotonic()
        if status is None:
            peak_kb = max(peak_kb, _high_water_kb(proc.pid))
            pid, raw, rusage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                status, usage, ended = raw, rusage, now
            elif now - start > timeout:
                timed_out = True
                kill_group(proc.pid)
                _, status, usage = os.wait4(proc.pid, 0)
                ended = time.monotonic()
        elif not open_fds or now - ended > grace:
            break
        if not open_fds:  # it closed both and runs on
            time.sleep(0.05)
            continue
        ready, _, _ = select.select(list(open_fds), [], [], 0.05)
        for fd in ready:
            chunk = os.read(fd, 1 << 16)
            if chunk:
                streams[fd].append(chunk)
            else:
                open_fds.discard(fd)
    held = time.monotonic() - ended if open_fds else 0.0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if end_group:
        kill_group(proc.pid)
    proc.stdout.close()
    proc.stderr.close()
    raw_out, raw_err = (b"".join(chunks) for chunks in streams.values())  # stdout first
    out, err = raw_out.decode("utf-8", "replace"), raw_err.decode("utf-8", "replace")
    return LimitedRun(None if timed_out else proc.returncode, out, err, ended - start,
                      cpu=usage.ru_utime + usage.ru_stime, max_rss_mb=(peak_kb or usage.ru_maxrss) / 1024, held_open=held,
                      memory_mb=memory_mb, pid=proc.pid, stdout_bytes=raw_out)


def _high_water_kb(pid: int) -> int:
    """The peak resident memory of ``pid``'s own address space (VmHWM), 0 where it cannot be read. Not
    the ``ru_maxrss`` of wait4: Linux counts in it the resident memory of the process that forked the
    child (the test runner, grown by the tests before) as it was at the fork, so a small run of
    preclint would read as large as its parent. Sampled while the child runs: growth in its last
    sampling interval (50 ms) is missed; RLIMIT_DATA still bounds it."""
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ------------------------------------------------------------------------------------ text

_BREAK = re.compile(r"\r\n|\r|\n")  # where the runner ends a line of a step's output
_VALUE = r"(?:[^%,:\r\n]|%25|%0D|%0A|%3A|%2C)"
_DATA = r"(?:[^%\r\n]|%25|%0D|%0A)*"
OWN_ANNOTATION = re.compile(
    rf"::(?:error|warning|notice) (?:file={_VALUE}+,line=[1-9]\d*,(?:endLine=[1-9]\d*,)?col=[1-9]\d*,"
    rf"(?:endColumn=[1-9]\d*,)?)?title=preclint(?: \(PCL\d{{3}}\))?::{_DATA}\Z")
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _starts_command(line: str) -> bool:
    stripped = line.lstrip()
    return stripped.startswith("::") or stripped.startswith("##[")


def after_breaks(payloads: Iterable[str]) -> List[str]:
    """What follows a line break in each hostile name: where an injected line would begin."""
    tails = []
    for payload in payloads:
        for tail in _BREAK.split(payload)[1:]:
            if tail.strip():
                tails.append(tail.lstrip())
    return tails


def injection_problem(text: str, stream: str, fmt: str, payloads: Sequence[str] = ()) -> Optional[str]:
    """A workflow command in ``text`` (``stream``: stdout or stderr) that preclint did not mean."""
    tails = after_breaks(payloads)
    for line in _BREAK.split(text):
        stripped = line.lstrip()
        for tail in tails:
            if stripped.startswith(tail):
                return f"{stream}: a line begins with a hostile name's second line: {line[:100]!r}"
        if not _starts_command(line):
            continue
        if fmt == "github" and stream == "stdout" and OWN_ANNOTATION.match(line):
            continue
        return f"{stream}: a workflow command preclint did not mean: {line[:100]!r}"
    return None


def control_problem(text: str, stream: str) -> Optional[str]:
    found = CONTROL.search(text)
    if found is None:
        return None
    at = found.start()
    return f"{stream}: raw {found.group()!r} in {text[max(0, at - 30):at + 30]!r}"


def markup_problem(text: str, payloads: Sequence[Tuple[str, str]]) -> Optional[str]:
    """Each ``(payload, marker)``: every place the marker is printed must hold the payload as written
    around it, and the marker must be printed (the report names every hostile module or file)."""
    for payload, marker in payloads:
        offset = payload.index(marker)
        positions = [m.start() for m in re.finditer(re.escape(marker), text)]
        if not positions:
            return f"{payload!r} is not printed at all"
        for at in positions:
            if text[at - offset:at - offset + len(payload)] != payload:
                return f"{payload!r} printed as {text[max(0, at - offset - 10):at + len(marker) + 10]!r}"
    return None


# ------------------------------------------------------------------------------------ html

_DANGEROUS_TAGS = frozenset("a script iframe img object embed form base meta link svg math style input button "
                            "video audio source frame frameset".split())
_PLOTLY_TAG = re.compile(r"<\s*/?\s*(a|b|i|em|strong|br|span|sub|sup|s|u|img|script|iframe)\b", re.I)


class _Parser(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.starts: List[Tuple[str, List[Tuple[str, Optional[str]]]]] = []
        self.scripts: List[Tuple[Dict[str, Optional[str]], str]] = []
        self._script: Optional[Dict[str, Optional[str]]] = None
        self._data: List[str] = []

    def handle_starttag(self, tag, attrs):
        self.starts.append((tag, attrs))
        if tag == "script":
            self._script, self._data = dict(attrs), []

    def handle_endtag(self, tag):
        if tag == "script" and self._script is not None:
            self.scripts.append((self._script, "".join(self._data)))
            self._script = None

    def handle_data(self, data):
        if self._script is not None:
            self._data.append(data)


def strings(value) -> Iterable[str]:
    """Every string in a JSON value, keys included."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from strings(k)
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def html_problem(text: str, markers: Collection[str]) -> Optional[str]:
    """Live HTML made of a hostile name: a tag or an event attribute, a script that holds the name
    (the page's own scripts never do), or a chart label plotly would draw as HTML."""
    parser = _Parser()
    parser.feed(text)
    parser.close()

    def marked(s: str) -> bool:
        return any(m in s for m in markers)

    for tag, attrs in parser.starts:
        values = " ".join(v or "" for _, v in attrs)
        events = [k for k, _ in attrs if k.startswith("on")]
        if marked(tag + " " + " ".join(k for k, _ in attrs)) or (marked(values) and (tag in _DANGEROUS_TAGS or events)):
            return f"a <{tag}> made of a hostile name: {values[:100]!r}"
    for attrs, body in parser.scripts:
        if attrs.get("type") == "application/json":
            try:
                data = json.loads(body)
            except ValueError as exc:
                return f"the report's data does not parse: {exc}"
            for s in strings(data):
                if marked(s) and _PLOTLY_TAG.search(s):
                    return f"a chart label plotly draws as HTML: {s[:100]!r}"
        elif marked(body):
            return "a script holds a hostile name"
    return None


# ------------------------------------------------------------------------------------ sarif

_URI = re.compile(r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/]|%[0-9A-Fa-f]{2})*\Z")


def sarif_uri_problem(stdout: str) -> Optional[str]:
    """Every ``uri`` of a SARIF log holds only what a URI path may hold unencoded."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None  # invalid-document says so

    def walk(value):
        if isinstance(value, dict):
            for k, v in value.items():
                if k == "uri" and isinstance(v, str):
                    yield v
                else:
                    yield from walk(v)
        elif isinstance(value, list):
            for v in value:
                yield from walk(v)

    for uri in walk(doc):
        if not _URI.match(uri):
            return f"a SARIF uri is not percent-encoded: {uri[:100]!r}"
    return None


# ------------------------------------------------------------------------------------ judging

_OUT_OF_MEMORY = ("MemoryError", "std::bad_alloc", "Cannot allocate memory", "out of memory", "DefaultCPUAllocator")


def memory_problem(run: LimitedRun) -> Optional[str]:
    said = next((word for word in _OUT_OF_MEMORY if word in run.stderr), None)
    if said:
        return f"ran out of its {run.memory_mb} MB ({said})"
    if run.memory_mb and run.max_rss_mb > 0.75 * run.memory_mb:
        return f"used {run.max_rss_mb:.0f} MB of its {run.memory_mb} MB"
    if run.rc is not None and run.rc == -signal.SIGKILL:
        return "killed (SIGKILL)"
    return None


def judge_attack(run: LimitedRun, argv: Sequence[str], expected: Collection[int], *,
                 payloads: Sequence[str] = (), markup: Sequence[Tuple[str, str]] = (),
                 html: Optional[str] = None, markers: Collection[str] = ()) -> Verdict:
    """The verdict on one run: ``expected`` exit statuses; ``payloads`` the hostile names in play,
    ``markup`` those (with their markers) that must print as written, ``html`` the HTML report."""
    from benchmarks.fuzz.oracle import _format_of

    fmt = _format_of(argv)
    if run.rc is None:
        return Verdict("hang", f"no end within {run.seconds:.0f} s")
    problem = memory_problem(run)
    if problem:
        return Verdict("memory", problem)
    base = judge(run, argv, valid=False)
    if base.failure == "crash":
        return base
    if run.held_open:
        return Verdict("held-stdout", f"stdout/stderr still open {run.held_open:.0f} s after preclint ended")
    for stream, text in (("stdout", run.stdout), ("stderr", run.stderr)):
        problem = injection_problem(text, stream, fmt, payloads)
        if problem:
            return Verdict("injection", problem)
        if stream == "stderr" or fmt in TEXT_FORMATS:
            problem = control_problem(text, stream)
            if problem:
                return Verdict("control-chars", problem)
    if markup and fmt in ("full", "concise"):
        problem = markup_problem(run.stdout + run.stderr, markup)
        if problem:
            return Verdict("markup-eaten", problem)
    if html is not None:
        problem = html_problem(html, markers)
        if problem:
            return Verdict("live-html", problem)
    if fmt == "sarif" and run.rc != 2:
        problem = document_problem("sarif", run.stdout) or sarif_uri_problem(run.stdout)
        if problem:
            return Verdict("invalid-document" if "uri" not in problem else "sarif-uri", problem)
    if run.rc not in expected:
        return Verdict("exit-status", f"exit {run.rc}, expected {sorted(expected)}: {run.stderr.strip()[-160:]!r}")
    if base.failure is not None:
        return base
    return Verdict()
