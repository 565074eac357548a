"""Running a case through preclint's command line and judging the run.

A run fails the oracle when it shows any of these (the failure's class first):

- ``crash``: a traceback, an "internal error", an exception that escapes ``main``, a process ended
  by a signal;
- ``hang``: a run past its time limit (preclint's own ``--timeout`` on a model that runs in
  milliseconds counts too);
- ``invalid-document``: json, sarif, rdjson, gitlab or junit output that does not parse or does not validate
  (SARIF against the 2.1.0 schema, json against tests/data/report.schema.json, rdjson against
  reviewdog's Diagnostic format, gitlab against the fields GitLab reads with one fingerprint an issue,
  junit against Jenkins's JUnit schema), GitHub output with a malformed workflow command;
- ``exit-status``: an exit status other than 0, 1, 2 (130 only after the SIGINT the harness sent);
- ``user-error``: exit 2 without an error line, an error line with exit 0 or 1, or stderr lines that
  are neither preclint's lines nor the model's own output;
- ``rejected-valid``: a model that runs eagerly on its example inputs could not be checked (the
  message is kept: some are limits preclint states, the rest are bugs);
- ``modified-input``: a file of the case changed although no fix was asked for.

Source cases add ``fix-broke`` (a fix made a file that compiled into one that does not),
``fix-touched`` (a file not given, or given without a fix to make, changed) and ``fix-unstable`` (a
second ``--fix`` still changes the file) in ``benchmarks.fuzz.sources``.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Optional, Sequence

ROOT = Path(__file__).resolve().parents[2]
SARIF_SCHEMA = ROOT / "tests" / "data" / "sarif-schema-2.1.0.json"
GITLAB_SCHEMA = ROOT / "tests" / "data" / "gitlab-codequality.schema.json"
JUNIT_SCHEMA = ROOT / "tests" / "data" / "junit-10.xsd"
REPORT_SCHEMA = ROOT / "tests" / "data" / "report.schema.json"

# stderr lines a run may print besides the model's own output
_STDERR_OK = re.compile(
    r"^(preclint( \w+)?: (error|interrupted|warning)|warning: |Fixed \d+ finding|\d+ fix(es)? in \d+ files? would be"
    r"|usage: preclint)"
)


# what preclint says it cannot do, by design: a model that runs is refused with these, and rightly
LIMITATIONS = (
    "--no-run forbids recording a run",  # a model FX cannot trace needs one run to be captured
    "there is nothing to measure reduced precision against",  # --probe on a model whose float64 run is not finite
)


@dataclass
class Run:
    rc: Optional[int]  # None: it did not end in time
    stdout: str
    stderr: str
    seconds: float
    escaped: Optional[str] = None  # the traceback of an exception that escaped main()
    interrupted: bool = False  # the harness sent SIGINT


@dataclass
class Verdict:
    failure: Optional[str] = None  # the class, None when the run passed
    detail: str = ""  # one line: what was wrong
    signature: str = ""  # failures with one signature are one bug

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass
class Checked:
    """What one case gave: the verdict, the run, and how long it took."""

    verdict: Verdict
    run: Optional[Run] = None
    extra: Dict[str, object] = field(default_factory=dict)


# ------------------------------------------------------------------------------------ running

def run_in_process(argv: Sequence[str], cwd: str) -> Run:
    """``preclint.cli.main(argv)`` in this process, in ``cwd``, its stdout and stderr captured."""
    from preclint.cli import main

    out, err = io.StringIO(), io.StringIO()
    saved = sys.stdout, sys.stderr
    here = os.getcwd()
    escaped = None
    rc: Optional[int] = None
    start = time.perf_counter()
    os.chdir(cwd)
    sys.stdout, sys.stderr = out, err
    try:
        rc = main(list(argv))
    except BaseException:  # noqa: BLE001 - anything that leaves main() is a failure to report
        escaped = traceback.format_exc()
    finally:
        sys.stdout, sys.stderr = saved
        os.chdir(here)
    return Run(rc, out.getvalue(), err.getvalue(), time.perf_counter() - start, escaped)


def run_in_child(argv: Sequence[str], cwd: str, timeout: float, interrupt: Optional[float] = None,
                 env: Optional[Dict[str, str]] = None) -> Run:
    """``python -m preclint ARGV`` in a child process; SIGINT after ``interrupt`` seconds if given."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "preclint", *argv], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **(env or {})}, start_new_session=True)
    sent = False
    try:
        if interrupt is not None:
            try:
                proc.wait(interrupt)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)
                sent = True
        out, err = proc.communicate(timeout=timeout)
        rc: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        rc = None
    return Run(rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.perf_counter() - start,
               interrupted=sent)


# ------------------------------------------------------------------------------------ judging

_SCHEMAS: Dict[str, object] = {}


def _schema(path: Path):
    if path not in _SCHEMAS:
        _SCHEMAS[str(path)] = json.loads(path.read_text())
    return _SCHEMAS[str(path)]


def _strict_json(text: str):
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def document_problem(fmt: str, stdout: str) -> Optional[str]:
    """Why ``stdout`` is not a valid document of format ``fmt``; None when it is (or the format is text)."""
    import jsonschema

    if fmt == "junit":
        return junit_problem(stdout)
    if fmt in ("json", "sarif", "rdjson", "gitlab"):
        try:
            doc = _strict_json(stdout)
        except ValueError as exc:
            return f"{fmt} output does not parse: {str(exc)[:120]}"
        try:
            if fmt == "sarif":
                jsonschema.validate(doc, _schema(SARIF_SCHEMA))
            elif fmt == "gitlab":
                jsonschema.validate(doc, _schema(GITLAB_SCHEMA))
                fingerprints = [issue["fingerprint"] for issue in doc]
                if len(set(fingerprints)) != len(fingerprints):
                    return "gitlab output: two issues share a fingerprint (GitLab shows one of them)"
            elif fmt == "json":
                for entry in doc if isinstance(doc, list) else [doc]:
                    if not isinstance(entry, dict):
                        return "json output: an entry is not an object"
                    jsonschema.validate(entry, _schema(REPORT_SCHEMA))
            else:
                return rdjson_problem(doc)
        except jsonschema.ValidationError as exc:
            where = "/".join(str(p) for p in exc.absolute_path)
            return f"{fmt} output does not validate at {where or 'the root'}: {exc.message[:120]}"
        return None
    if fmt == "github":
        return github_problem(stdout)
    return None


def junit_problem(text: str) -> Optional[str]:
    """Why ``text`` is no JUnit XML document that Jenkins's schema accepts; None when it is."""
    import xmlschema

    try:
        xmlschema.XMLSchema(str(JUNIT_SCHEMA)).validate(text)
    except (xmlschema.XMLSchemaException, SyntaxError, ValueError) as exc:
        return f"junit output does not validate: {str(exc).splitlines()[0][:120]}"
    return None


def rdjson_problem(doc) -> Optional[str]:
    """reviewdog's DiagnosticResult: ``diagnostics`` of Diagnostic, each a message, an optional
    location (path, range.start line/column from 1), severity, source, code."""
    if not isinstance(doc, dict) or not isinstance(doc.get("diagnostics"), list):
        return "rdjson: no diagnostics list"

    def position(p, where) -> Optional[str]:
        if not isinstance(p, dict):
            return f"{where} is not an object"
        for key in ("line", "column"):
            if key in p and (not isinstance(p[key], int) or isinstance(p[key], bool) or p[key] < 1):
                return f"{where}.{key} is {p[key]!r}"
        return None

    def location(loc, where) -> Optional[str]:
        if not isinstance(loc, dict) or not isinstance(loc.get("path"), str) or not loc["path"]:
            return f"{where}: no path"
        rng = loc.get("range")
        if rng is not None:
            if not isinstance(rng, dict) or "start" not in rng:
                return f"{where}.range has no start"
            return position(rng["start"], f"{where}.range.start") or (
                position(rng["end"], f"{where}.range.end") if "end" in rng else None)
        return None

    for i, d in enumerate(doc["diagnostics"]):
        if not isinstance(d, dict) or not isinstance(d.get("message"), str):
            return f"rdjson: diagnostic {i} has no message"
        if d.get("severity", "ERROR") not in ("UNKNOWN_SEVERITY", "ERROR", "WARNING", "INFO"):
            return f"rdjson: diagnostic {i} has severity {d.get('severity')!r}"
        if "location" in d and (problem := location(d["location"], f"diagnostic {i}.location")):
            return f"rdjson: {problem}"
        for j, rel in enumerate(d.get("related_locations", [])):
            if problem := location(rel.get("location") if isinstance(rel, dict) else None, f"diagnostic {i}.related {j}"):
                return f"rdjson: {problem}"
        if "code" in d and not isinstance(d["code"].get("value") if isinstance(d["code"], dict) else None, str):
            return f"rdjson: diagnostic {i} has a code without a value"
    return None


_COMMAND = re.compile(r"^::(error|warning|notice)( ([a-z]+=[^,:]*)(,[a-z]+=[^,:]*)*)?::(.*)$")


def github_problem(stdout: str) -> Optional[str]:
    """GitHub workflow commands: properties escaped, at most 10 annotations of each level."""
    counts: Dict[str, int] = {}
    for line in stdout.splitlines():
        if not line.startswith("::"):
            continue
        m = _COMMAND.match(line)
        if not m:
            return f"github: malformed command {line[:100]!r}"
        if "\r" in line:
            return "github: a raw carriage return in a command"
        counts[m.group(1)] = counts.get(m.group(1), 0) + 1
        props = dict(p.split("=", 1) for p in (m.group(2) or "").strip().split(",") if p)
        for key in ("line", "col"):
            if key in props and not (props[key].isdigit() and int(props[key]) >= 1):
                return f"github: {key}={props[key]!r}"
    over = [level for level, n in counts.items() if n > 10]
    return f"github: {counts[over[0]]} {over[0]} annotations (GitHub keeps 10)" if over else None


def _format_of(argv: Sequence[str]) -> str:
    fmt = "full"
    for i, arg in enumerate(argv):
        if arg == "--output-format" and i + 1 < len(argv):
            fmt = argv[i + 1]
        elif arg.startswith("--output-format="):
            fmt = arg.split("=", 1)[1]
    return fmt


def _innermost(text: str) -> str:
    """``file:function`` of the innermost frame of preclint in a traceback, and the exception type."""
    frames = re.findall(r'File "([^"]+)", line \d+, in (\S+)', text)
    ours = [(f, fn) for f, fn in frames if "/preclint/" in f]
    where = f"{Path(ours[-1][0]).name}:{ours[-1][1]}" if ours else (f"{Path(frames[-1][0]).name}:{frames[-1][1]}" if frames else "?")
    last = [line for line in text.strip().splitlines() if line and not line.startswith(" ")]
    exc = last[-1].split(":")[0] if last else "?"
    return f"{exc} at {where}"


def normalise(message: str, keep_names: bool = False) -> str:
    """A message without its particulars (numbers, names, paths), for grouping failures; with
    ``keep_names`` the quoted names stay (in an internal error they say which bug it is)."""
    text = message if keep_names else re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", message)
    text = re.sub(r"\S+\.py(:\w+)?(:\d+)?", "FILE", text)
    text = re.sub(r"\b\d[\d.e+-]*\b", "N", text)
    text = re.sub(r"\b(torch\.)?(float|int|bfloat|uint|complex)\d*\b|\bbool\b", "DTYPE", text)
    text = re.sub(r"\([^()]*\)", "(…)", text)
    return " ".join(text.split())[:160]


def judge(run: Run, argv: Sequence[str], valid: bool, targets: int = 1, interrupted_ok: bool = False) -> Verdict:
    """The verdict on one run of ``argv``; ``valid``: every model in it runs and every flag is well
    formed (so an exit of 2 means preclint could not check a model it should have)."""
    fmt = _format_of(argv)
    if run.escaped:
        return Verdict("crash", f"escaped main(): {run.escaped.strip().splitlines()[-1][:160]}",
                       f"crash: escaped {_innermost(run.escaped)}")
    if run.rc is None:
        return Verdict("hang", f"no end within {run.seconds:.0f} s", "hang: harness time limit")
    if run.rc < 0:
        name = signal.Signals(-run.rc).name if -run.rc in signal.valid_signals() else str(-run.rc)
        return Verdict("crash", f"ended by {name}", f"crash: signal {name}")
    for stream, text in (("stderr", run.stderr), ("stdout", run.stdout)):
        if "Traceback (most recent call last)" in text:
            return Verdict("crash", f"a traceback on {stream}: {text.strip().splitlines()[-1][:160]}",
                           f"crash: traceback {_innermost(text)}")
    internal = [line for line in run.stderr.splitlines() if "internal error" in line]
    if internal:
        return Verdict("crash", internal[0][:200], f"crash: {normalise(internal[0], keep_names=True)}")
    allowed = {0, 1, 2} | ({130} if run.interrupted or interrupted_ok else set())
    if run.rc not in allowed:
        return Verdict("exit-status", f"exit {run.rc}", f"exit-status: {run.rc}")
    if run.rc == 130:
        if "preclint: interrupted (SIGINT)" not in run.stderr:
            return Verdict("user-error", "exit 130 without the interrupted line", "user-error: 130 silent")
        return Verdict()
    errors = [line for line in run.stderr.splitlines() if re.match(r"^preclint( \w+)?: error", line)]
    gave_up = [line for line in errors if "gave up after" in line]
    if gave_up and valid:
        return Verdict("hang", gave_up[0][:200], f"hang: {normalise(gave_up[0])}")
    if run.rc == 2 and not errors:
        return Verdict("user-error", "exit 2 without an error line", "user-error: exit 2 silent")
    if run.rc != 2 and errors:
        return Verdict("user-error", f"exit {run.rc} with {errors[0][:160]}", "user-error: error line without exit 2")
    if len(errors) > max(targets, 1):
        return Verdict("user-error", f"{len(errors)} error lines for {targets} model(s)", "user-error: several lines")
    stray = [line for line in run.stderr.splitlines() if line.strip() and not _STDERR_OK.match(line)]
    if stray:
        return Verdict("user-error", f"stray stderr line: {stray[0][:160]}", f"user-error: stray {normalise(stray[0])}")
    if "--diff" in argv:
        bad = [line for line in run.stdout.splitlines() if not re.match(r"(---|\+\+\+|@@|[ +\-\\]|$)", line)]
        if bad:
            return Verdict("invalid-document", f"--diff printed a line that is no diff: {bad[0][:120]!r}",
                           "invalid-document: diff")
    elif run.stdout.strip() or fmt in ("json", "sarif", "rdjson") and run.rc != 2:
        problem = document_problem(fmt, run.stdout)
        if problem:
            return Verdict("invalid-document", problem, f"invalid-document: {normalise(problem)}")
    if run.rc == 2 and valid:
        stated = [line for line in errors if not any(limit in line for limit in LIMITATIONS)]
        if stated:
            return Verdict("rejected-valid", stated[0][:240], f"rejected-valid: {normalise(stated[0])}")
    return Verdict()


# ------------------------------------------------------------------------------------ files

def snapshot(directory: str) -> Dict[str, str]:
    """sha256 of every file under ``directory`` (caches and bytecode left out)."""
    digests = {}
    for base, dirs, files in os.walk(directory):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            path = os.path.join(base, name)
            if os.path.islink(path) or not os.path.isfile(path):
                continue
            with open(path, "rb") as f:
                digests[os.path.relpath(path, directory)] = hashlib.sha256(f.read()).hexdigest()
    return digests


def write_case_files(directory: str, files: Dict[str, str], binary: Optional[Dict[str, bytes]] = None) -> None:
    for name, text in files.items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    for name, data in (binary or {}).items():
        path = os.path.join(directory, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)


def check_model_case(case, directory: str, timeout: float = 300.0) -> Checked:
    """Write the case's files into ``directory``, run its command line, judge it."""
    write_case_files(directory, case.files, case.binary)
    before = snapshot(directory)
    targets = sum(1 for a in case.argv if a.split(":")[0].endswith(".py"))
    if case.process:
        run = run_in_child(case.argv, directory, timeout, interrupt=case.interrupt)
    else:
        run = run_in_process(case.argv, directory)
    verdict = judge(run, case.argv, case.valid, targets)
    if verdict.ok and not case.valid and run.rc not in (2, 130):
        verdict = Verdict("user-error", f"a model with a mistake ({', '.join(t for t in case.tags if t.startswith('fault'))})"
                          f" exited {run.rc}", "user-error: mistake not reported")
    if verdict.ok:
        after = snapshot(directory)
        changed = sorted(name for name in before if after.get(name) != before[name])
        if changed:
            verdict = Verdict("modified-input", f"{changed[0]} changed", "modified-input: model run")
    return Checked(verdict, run)
