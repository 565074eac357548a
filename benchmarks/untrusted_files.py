"""What a checkout, a shared cache directory or a restored CI cache can plant where preclint reads and
writes, tried class by class as a CI run meets it (`python -m preclint check --source-only ...` in a
fresh process, in a scratch directory, under a time limit and a memory limit).

The classes: files planted where the cache lives; cache files edited by hand; baselines and
configurations that are no files (FIFOs, devices, nesting, size); `-o` / `--write-baseline` aimed at an
input of the run or through a link; `--fix` meeting files it cannot write. Each try is judged by what
the user sees: the findings are still those of the files, a mistake ends in one line and exit 2, no
hang, no traceback, and no file outside preclint's own is changed. The outcome of each try is written
to a JSON file under ``--label``, so that two runs (before and after a change) sit side by side:

    python benchmarks/untrusted_files.py --label before --root ../main --out benchmarks/results/untrusted_files.json
    python benchmarks/untrusted_files.py --label after --out benchmarks/results/untrusted_files.json

Nothing outside the scratch directories is touched, even by code that writes through links as root:
a "device" planted is a node made in the scratch directory (main replaced /dev/zero itself).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable, List, Optional

if __package__ in (None, ""):  # run as a script: the repository root, for benchmarks.provenance
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import git_commit, stamp, store_labelled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENCODE: Optional[Callable] = None  # the checked code's cache encoder, where it has one (main has none)
AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"
FINDING = "pkg/m.py:3:6: PCL502"
USERS = "the user's own file\n"
TIME_LIMIT = 30  # seconds a try may take; main hangs for ever on a FIFO
MEMORY_LIMIT = 4 << 30  # main reads a link to /dev/zero until memory runs out
MODEL_TIME_LIMIT = 180  # seconds a try that imports torch and checks a model may take (2 shared cores)


@dataclass
class Try:
    klass: str
    name: str
    setup: Callable[[str, str], List[str]]  # (scratch directory, root) -> the arguments after `check --source-only`
    judge: Callable[[str, "Run"], Optional[str]]  # None: as it should be; else what went wrong
    root_only: bool = False
    model: bool = False  # a model check (`check MODEL`, torch imported), not `check --source-only`


@dataclass
class Run:
    rc: Optional[int]
    stdout: str
    stderr: str
    seconds: float


def preclint(directory: str, args: List[str], root: str, model: bool = False) -> Run:
    env = {**os.environ, "PYTHONPATH": root, "PRECLINT_CACHE_DIR": os.path.join(directory, "cache"),
           "HOME": os.path.join(directory, "home")}
    started = time.monotonic()
    kind = [] if model else ["--source-only"]
    try:
        done = subprocess.run([sys.executable, "-m", "preclint", "check", *kind, "--output-format",
                               "concise", *args], cwd=directory, env=env, capture_output=True, text=True,
                              timeout=MODEL_TIME_LIMIT if model else TIME_LIMIT,
                              preexec_fn=None if model else _limit_memory)
        return Run(done.returncode, done.stdout, done.stderr, time.monotonic() - started)
    except subprocess.TimeoutExpired as exc:
        return Run(None, exc.stdout or "", exc.stderr or "", time.monotonic() - started)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        out.write(text)


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as handle:
            return handle.read()
    except OSError:
        return None


def _project(directory: str) -> None:
    _write(os.path.join(directory, "pkg", "m.py"), AMP)
    _write(os.path.join(directory, "users_file.txt"), USERS)


def _zero_device(directory: str) -> str:
    """A zero device of the scratch directory's own (root), else the machine's (which others cannot replace)."""
    if os.geteuid() != 0:
        return "/dev/zero"
    path = os.path.join(directory, "zero")
    os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 5))
    return path


def _problems(directory: str, run: Run, *, error: bool = False, words=()) -> Optional[str]:
    """What is wrong with ``run``: a hang, a traceback, a changed user file; with ``error``, anything but
    exit 2 and one line; else findings other than pkg/m.py's one."""
    if run.rc is None:
        return f"no end within {TIME_LIMIT} s"
    if "Traceback" in run.stderr or "internal error" in run.stderr:
        return "internal error: " + run.stderr.strip().splitlines()[-1][:120]
    if _read(os.path.join(directory, "users_file.txt")) != USERS:
        return "the user's file was changed"
    zero = os.path.join(directory, "zero")
    if os.path.lexists(zero) and not stat.S_ISCHR(os.lstat(zero).st_mode):
        return "the device node was replaced by a file"
    if error:
        if run.rc != 2 or run.stderr.count("\n") != 1:
            return f"exit {run.rc}, {run.stderr.count(chr(10))} stderr lines: {run.stderr.strip()[:120]!r}"
        missing = [w for w in words if w not in run.stderr]
        return f"stderr lacks {missing}: {run.stderr.strip()[:120]!r}" if missing else None
    if run.rc != 1 or not run.stdout.startswith(FINDING) or "Found 1 finding." not in run.stdout:
        return f"wrong findings (exit {run.rc}): {run.stdout.strip()[:100]!r}"
    return None


# ---------------------------------------------------------------------------- the cache

def _cache_file(directory: str, root: str) -> str:
    """The cache file of a first run, made by the code under test."""
    assert preclint(directory, ["pkg"], root).rc == 1
    for where, _, names in os.walk(os.path.join(directory, "cache")):
        for name in names:
            if name.endswith(".json"):
                return os.path.join(where, name)
    raise AssertionError("the first run wrote no cache")


def _planted(plant: Callable[[str, str], None]):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        cache_file = _cache_file(directory, root)
        plant(directory, cache_file)
        _write(os.path.join(directory, "pkg", "m.py"), AMP + "\n")  # a new entry to write
        return ["pkg"]
    return setup


def _replace_with_link(target: Callable[[str], str]):
    def plant(directory: str, cache_file: str) -> None:
        os.unlink(cache_file)
        os.symlink(target(directory), cache_file)
    return plant


def _link_directory(levels: int):
    def plant(directory: str, cache_file: str) -> None:
        level = cache_file
        for _ in range(levels):
            level = os.path.dirname(level)
        elsewhere = os.path.join(directory, "users_directory")
        os.mkdir(elsewhere)
        shutil.move(level, os.path.join(directory, "moved"))
        os.symlink(elsewhere, level)
    return plant


def _chown(levels: int):
    def plant(directory: str, cache_file: str) -> None:
        level = cache_file
        for _ in range(levels):
            level = os.path.dirname(level)
        os.chown(level, 12345, 12345)
    return plant


def _fifo_plant(directory: str, cache_file: str) -> None:
    os.unlink(cache_file)
    os.mkfifo(cache_file)


def _hard_link(directory: str, cache_file: str) -> None:
    os.unlink(cache_file)
    os.link(os.path.join(directory, "users_file.txt"), cache_file)


def _planted_tries() -> List[Try]:
    plants = {
        "link to the user's file": _replace_with_link(lambda d: os.path.join(d, "users_file.txt")),
        "link to a zero device": _replace_with_link(_zero_device),
        "link to a FIFO": _replace_with_link(lambda d: (os.mkfifo(os.path.join(d, "f")), os.path.join(d, "f"))[1]),
        "dangling link": _replace_with_link(lambda d: os.path.join(d, "nothing")),
        "FIFO": _fifo_plant,
        "hard link to the user's file": _hard_link,
        "link for the project's directory": _link_directory(1),
        "link for the version directory": _link_directory(2),
    }
    tries = [Try("cache: planted", name, _planted(plant), _planted_judge) for name, plant in plants.items()]
    for name, levels in (("file of another user", 0), ("directory of another user", 1)):
        tries.append(Try("cache: planted", name, _planted(_chown(levels)), _planted_judge, root_only=True))
    return tries


def _planted_judge(directory: str, run: Run) -> Optional[str]:
    """The findings of the files, nothing written where a planted link leads, and a warning that says
    the cache was not used."""
    problem = _problems(directory, run)
    elsewhere = os.path.join(directory, "users_directory")
    if problem is None and os.path.isdir(elsewhere) and os.listdir(elsewhere):
        problem = f"wrote {os.listdir(elsewhere)} into the directory a planted link names"
    if problem is None and "warning: cache:" not in run.stderr:
        problem = "no warning that the cache was not used"
    return problem


def _edited(edit: Callable[[dict], None], checksum: bool):
    """A cache file whose entry ``edit`` changes; ``checksum``: recomputed, as a forger who read the code would."""
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        cache_file = _cache_file(directory, root)
        with open(cache_file) as handle:
            document = json.load(handle)
        (entry,) = document["files"].values()
        edit(entry)
        data = json.dumps(document, separators=(",", ":")).encode()
        if checksum and ENCODE is not None:
            data = ENCODE(document["settings"], document["files"])
        with open(cache_file, "wb") as out:
            out.write(data)
        return ["pkg"]
    return setup


def _bytes(data: bytes):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        with open(_cache_file(directory, root), "wb") as out:
            out.write(data)
        return ["pkg"]
    return setup


def _field(index: int, value):
    return lambda entry: entry[2][0].__setitem__(index, value)


def _edited_tries() -> List[Try]:
    invented = ["PCL502", "deprecated-amp-api", "warning", "invented", "", 1, 1, [], True]
    edits = {
        "severity 'bogus'": _field(2, "bogus"), "unknown code": _field(0, "PCL999"),
        "another rule's name": _field(1, "tf32-flags"), "line as text": _field(5, "3"), "line True": _field(5, True),
        "line 0": _field(5, 0), "line past the file": _field(5, 4000), "column -1": _field(6, -1),
        "column past the file": _field(6, 10 ** 6), "precision 'fp4'": _field(7, ["fp4"]),
        "fixable as text": _field(8, "yes"), "message not text": _field(3, None), "8 fields": lambda e: e[2][0].pop(),
        "digest not hex": lambda e: e.__setitem__(1, "z" * 32), "printed path a number": lambda e: e.__setitem__(0, 7),
        "suppression of kind 'evil'": lambda e: e[3].append([1, 1, "evil", [], []]),
        "finding removed": lambda e: e.__setitem__(2, []), "finding invented": lambda e: e[2].append(invented),
    }
    tries = [Try("cache: edited, checksum recomputed", name, _edited(edit, True), lambda d, r: _problems(d, r))
             for name, edit in edits.items() if name not in ("finding removed", "finding invented")]
    tries += [Try("cache: edited by hand", name, _edited(edit, False), lambda d, r: _problems(d, r))
              for name, edit in edits.items()]
    # the limit: a forger who recomputes the checksum over a well-formed "this file is clean" is believed
    tries.append(Try("cache: forged whole (known limit)", "finding removed, checksum recomputed",
                     _edited(edits["finding removed"], True), lambda d, r: _problems(d, r)))
    garbage = {"nested 100000 deep": b"[" * 100_000 + b"]" * 100_000, "truncated": b'{"format":3,"files":{"x":[1,',
               "not UTF-8": b"\xff\xfe" * 100, "empty": b"", "a JSON list": b"[]"}
    tries += [Try("cache: not a cache", name, _bytes(data), lambda d, r: _problems(d, r)) for name, data in garbage.items()]
    tries.append(Try("cache: not a cache", "300 MiB (sparse)", _sparse_cache(300 << 20), lambda d, r: _problems(d, r)))
    return tries


def _sparse_cache(size: int):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        with open(_cache_file(directory, root), "r+b") as out:
            out.truncate(size)
        return ["pkg"]
    return setup


# ---------------------------------------------------------------------------- baselines and configurations

def _input(flag: str, make: Callable[[str], str]):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        return [flag, make(directory), "pkg"]
    return setup


def _file(name: str, data: bytes = b"", size: Optional[int] = None):
    def make(directory: str) -> str:
        path = os.path.join(directory, name)
        with open(path, "wb") as out:
            out.write(data)
            if size is not None:
                out.truncate(size)
        return path
    return make


def _fifo(directory: str) -> str:
    os.mkfifo(os.path.join(directory, "input"))
    return os.path.join(directory, "input")


def _link(target: Callable[[str], str]):
    def make(directory: str) -> str:
        os.symlink(target(directory), os.path.join(directory, "linked"))
        return os.path.join(directory, "linked")
    return make


def _read_tries() -> List[Try]:
    error = lambda d, r: _problems(d, r, error=True)  # noqa: E731
    inputs = {
        "FIFO": _fifo, "link to a FIFO": _link(_fifo), "link to a zero device": _link(_zero_device),
        "link to /dev/urandom": _link(lambda d: "/dev/urandom"), "a directory": lambda d: (os.mkdir(os.path.join(d, "dir")), os.path.join(d, "dir"))[1],
        "nested 100000 deep": _file("deep", b"[" * 100_000 + b"]" * 100_000),
        "objects nested 100000 deep": _file("deep", b'{"a":' * 100_000 + b"1" + b"}" * 100_000),
        "not UTF-8": _file("bad", b"\xff\xfe{}"),
        "sparse, 1 GiB": _file("huge", size=1 << 30),
    }
    tries = [Try("baseline: not a baseline", name, _input("--baseline", make), error) for name, make in inputs.items()]
    configs = dict(inputs)
    configs["nested 100000 deep"] = _file("deep.toml", b"[tool.preclint]\nselect = " + b"[" * 100_000 + b"]" * 100_000)
    configs["objects nested 100000 deep"] = _file("deep.toml", b"[tool.preclint]\nx = " + b"{a=" * 100_000 + b"1" + b"}" * 100_000)
    tries += [Try("config: not a configuration", name, _input("--config", make), error) for name, make in configs.items()]
    return tries


# ---------------------------------------------------------------------------- outputs

def _output(flag: str, target: Callable[[str], str], extra: List[str] = ()):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        _write(os.path.join(directory, "baseline.json"), '{"format": "preclint-baseline", "version": 1, "findings": []}\n')
        _write(os.path.join(directory, "pyproject.toml"), '[tool.preclint]\nselect = ["PCL5"]\n')
        return [*extra, flag, target(directory), "pkg"]
    return setup


def _output_judge(allowed: bool = False):
    """Refused: one line and exit 2; ``allowed``: the report went there (exit 1, nothing on stdout or
    stderr). Either way the baseline and the configuration are as they were."""
    def judge(directory: str, run: Run) -> Optional[str]:
        if allowed:
            problem = None if (run.rc, run.stdout, run.stderr) == (1, "", "") else f"exit {run.rc}: {run.stderr[:120]!r}"
        else:
            problem = _problems(directory, run, error=True)
        if problem:
            return problem
        if _read(os.path.join(directory, "baseline.json")) != '{"format": "preclint-baseline", "version": 1, "findings": []}\n':
            return "the baseline was replaced"
        if _read(os.path.join(directory, "pyproject.toml")) != '[tool.preclint]\nselect = ["PCL5"]\n':
            return "the configuration was replaced"
        return None
    return judge


def _hard_link_to(name: str):
    def make(directory: str) -> str:
        os.link(os.path.join(directory, name), os.path.join(directory, "alias"))
        return "alias"
    return make


def _output_tries() -> List[Try]:
    refused = _output_judge()
    base = ["--baseline", "baseline.json"]
    tries = [
        Try("output: an input of the run", "-o the baseline", _output("-o", lambda d: "baseline.json", base), refused),
        Try("output: an input of the run", "-o a hard link to the baseline", _output("-o", _hard_link_to("baseline.json"), base), refused),
        Try("output: an input of the run", "-o ./pkg/../baseline.json", _output("-o", lambda d: "./pkg/../baseline.json", base), refused),
        Try("output: an input of the run", "-o the configuration", _output("-o", lambda d: "pyproject.toml"), refused),
        Try("output: an input of the run", "--write-baseline the configuration",
            _output("--write-baseline", lambda d: "pyproject.toml"), refused),
        Try("output: an input of the run", "-o where --write-baseline goes",
            _output("-o", lambda d: "new.json", ["--write-baseline", "new.json"]), refused),
        Try("output: an input of the run", "-o a checked file", _output("-o", lambda d: "pkg/m.py"), refused),
        Try("output: a link", "-o a link to the user's file", _output("-o", _link(lambda d: os.path.join(d, "users_file.txt"))), refused),
        Try("output: a link", "--write-baseline a link to the user's file",
            _output("--write-baseline", _link(lambda d: os.path.join(d, "users_file.txt"))), refused),
        Try("output: a link", "-o a link to a zero device", _output("-o", _link(_zero_device)), refused),
        Try("output: a link", "-o a dangling link", _output("-o", _link(lambda d: os.path.join(d, "nothing"))), refused),
        Try("output: streams still work", "-o /dev/null", _output("-o", lambda d: os.devnull), _output_judge(allowed=True)),
        Try("output: streams still work", "-o a link to /dev/null", _output("-o", _link(lambda d: os.devnull)), _output_judge(allowed=True)),
    ]
    return tries


# ---------------------------------------------------------------------------- --fix

def _fix_setup(count: int, unwritable: List[int]):
    def setup(directory: str, root: str) -> List[str]:
        for index in range(count):
            path = os.path.join(directory, "pkg", f"m{index}.py")
            _write(path, AMP)
            if index in unwritable:
                if os.geteuid() == 0:
                    subprocess.run(["chattr", "+i", path], check=True)
                else:
                    os.chmod(path, 0o444)
        _write(os.path.join(directory, "users_file.txt"), USERS)
        return ["--no-cache", "--fix", "pkg"]
    return setup


def _fix_judge(count: int, unwritable: List[int]):
    def judge(directory: str, run: Run) -> Optional[str]:
        if run.rc is None:
            return "no end"
        lines = run.stderr.splitlines()
        for index in range(count):
            path = os.path.join(directory, "pkg", f"m{index}.py")
            text = _read(path)
            if index in unwritable:
                if text != AMP:
                    return f"m{index}.py (unwritable) changed"
                if not any(line.startswith(f"preclint: error: pkg/m{index}.py: not fixed") for line in lines):
                    return f"m{index}.py not said to be left unfixed"
            else:
                if "torch.cuda.amp" in text:
                    return f"m{index}.py (writable) was not fixed"
                if f"Fixed 1 finding in pkg/m{index}.py." not in lines:
                    return f"m{index}.py not said to be fixed"
        if unwritable and run.rc != 2:
            return f"exit {run.rc}"
        leftovers = sorted(set(os.listdir(os.path.join(directory, "pkg"))) - {f"m{i}.py" for i in range(count)})
        return f"left behind {leftovers}" if leftovers else None
    return judge


def _fix_tries() -> List[Try]:
    shapes = {"1 unwritable of 3 (the middle)": (3, [1]), "the first of 3": (3, [0]), "the last of 3": (3, [2]),
              "2 of 5": (5, [1, 3]), "all 3": (3, [0, 1, 2]), "none of 3": (3, [])}
    return [Try("fix: unwritable files", name, _fix_setup(n, bad), _fix_judge(n, bad)) for name, (n, bad) in shapes.items()]


# ---------------------------------------------------------------------------- links on the way

OUTSIDE_FILES = {"x.sarif": "precious\n", "b.json": "precious\n", "deeper/x.sarif": "precious\n", "x.py": AMP}


def _outside(directory: str) -> str:
    """A directory outside the project (the user's own), with files a write through a link would hit,
    and links to it committed in the project."""
    outside = os.path.join(directory, "home", "outside")
    for name, text in OUTSIDE_FILES.items():
        _write(os.path.join(outside, name), text)
    for link in ("reports", "dir_link", os.path.join("pkg", "nested")):
        os.symlink(outside, os.path.join(directory, link))
    return outside


def _through_link(args: Callable[[str], List[str]]):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        _outside(directory)
        return args(directory)
    return setup


def _through_link_judge(words=()):
    """One line and exit 2, and nothing in the directory the links lead to changed or added."""
    def judge(directory: str, run: Run) -> Optional[str]:
        outside = os.path.join(directory, "home", "outside")
        for name, text in OUTSIDE_FILES.items():
            if _read(os.path.join(outside, name)) != text:
                return f"{name} outside the project was written"
        if sorted(os.listdir(outside)) != ["b.json", "deeper", "x.py", "x.sarif"]:
            return f"files left outside the project: {sorted(os.listdir(outside))}"
        if run.rc is None:
            return "no end"
        if run.rc != 2 or not all(w in run.stderr for w in words):
            return f"exit {run.rc}: {run.stderr.strip()[-120:]!r}"
        return None
    return judge


def _link_on_the_way_tries() -> List[Try]:
    klass = "output: a link on the way"
    said = ("is a symbolic link",)
    cases = {
        "-o reports/x.sarif (reports -> outside)": lambda d: ["-o", "reports/x.sarif", "pkg"],
        "-o a new file through the link": lambda d: ["-o", "reports/new.sarif", "pkg"],
        "-o through a link two levels down": lambda d: ["-o", "pkg/nested/deeper/x.sarif", "pkg"],
        "-o pkg/../reports/x.sarif": lambda d: ["-o", "pkg/../reports/x.sarif", "pkg"],
        "-o an absolute path through the link": lambda d: ["-o", os.path.join(d, "reports", "x.sarif"), "pkg"],
        "--write-baseline reports/b.json": lambda d: ["--write-baseline", "reports/b.json", "pkg"],
        "--fix dir_link/x.py": lambda d: ["--no-cache", "--fix", "dir_link/x.py"],
    }
    return [Try(klass, name, _through_link(args), _through_link_judge(said)) for name, args in cases.items()]


# ---------------------------------------------------------------------------- globs that backtrack

PATHOLOGICAL = "*a*a*a*a*a*a*a*a*a*a*a*a*b"
LONG_NAME = "a" * 40 + ".py"


def _glob(where: str, pattern: str = PATHOLOGICAL):
    def setup(directory: str, root: str) -> List[str]:
        _project(directory)
        _write(os.path.join(directory, "pkg", LONG_NAME), "x = 1\n")
        os.mkdir(os.path.join(directory, ".git"))
        if where == ".gitignore":
            _write(os.path.join(directory, ".gitignore"), pattern + "\n")
        elif where == "pkg/.gitignore":
            _write(os.path.join(directory, "pkg", ".gitignore"), pattern + "\n")
        elif where == "exclude":
            _write(os.path.join(directory, "pyproject.toml"), f'[tool.preclint]\nexclude = ["{pattern}"]\n')
        elif where == "per-file-ignores":
            _write(os.path.join(directory, "pkg", LONG_NAME), AMP)
            _write(os.path.join(directory, "pyproject.toml"),
                   f'[tool.preclint]\nper-file-ignores = {{"{pattern}" = ["PCL502"]}}\n')
        elif where == ".git/info/exclude":
            _write(os.path.join(directory, ".git", "info", "exclude"), pattern + "\n")
        return ["pkg"]
    return setup


def _glob_judge(directory: str, run: Run) -> Optional[str]:
    if run.rc is None:
        return f"no end within {TIME_LIMIT} s"
    if run.rc != 1 or "Traceback" in run.stderr or "internal error" in run.stderr:
        return f"exit {run.rc}: {run.stderr.strip()[-120:]!r}"
    if FINDING not in run.stdout:
        return f"wrong findings: {run.stdout.strip()[:100]!r}"
    return None


def _glob_tries() -> List[Try]:
    klass = "glob: a pattern that backtracks"
    tries = [Try(klass, f"{PATHOLOGICAL} in {where}", _glob(where), _glob_judge)
             for where in (".gitignore", "pkg/.gitignore", ".git/info/exclude", "exclude", "per-file-ignores")]
    tries += [Try(klass, "**a**a**a**a**a**a**a**a**a**a**b in .gitignore", _glob(".gitignore", "**a" * 10 + "**b"),
                  _glob_judge),
              Try(klass, "*?*?*?*?*?*?*?*?*?*?*?*b in exclude", _glob("exclude", "*?" * 11 + "*b"), _glob_judge)]
    return tries


# ---------------------------------------------------------------------------- a model forging the verdict

OVERFLOWS = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        with torch.no_grad():
            self.fc.weight.mul_(1e4)

    def forward(self, x):
        return self.fc(x) * 1e3


model = Net()
example_inputs = (torch.randn(2, 8) * 100,)
"""
MODEL_FINDING = "forger.py:13:1: PCL101"


def _forger(tail: str, args: List[str]):
    def setup(directory: str, root: str) -> List[str]:
        _write(os.path.join(directory, "forger.py"), OVERFLOWS + tail)
        _write(os.path.join(directory, "report.sarif"), "stale\n")
        os.makedirs(os.path.join(directory, "elsewhere"))
        return [*args, "forger.py"]
    return setup


def _verdict_judge(report: Optional[str] = None):
    """Exit 1 with the finding (on stdout, or in ``report`` in the project's own directory)."""
    def judge(directory: str, run: Run) -> Optional[str]:
        if run.rc != 1:
            return f"exit {run.rc} for a run with a finding: {run.stderr.strip()[-120:]!r}"
        if report is None:
            return None if run.stdout.startswith(MODEL_FINDING) else f"wrong report: {run.stdout[:100]!r}"
        text = _read(os.path.join(directory, report)) or ""
        if "PCL101" not in text:
            return f"{report} in the project is {text[:40]!r}; elsewhere: {os.listdir(os.path.join(directory, 'elsewhere'))}"
        return None
    return judge


def _verdict_tries() -> List[Try]:
    klass = "model: forging the verdict"
    chdir = 'import os\nos.chdir("elsewhere")\n'
    exits = {
        "atexit os._exit(0)": "import atexit, os\natexit.register(lambda: os._exit(0))\n",
        "atexit posix._exit(0)": "import atexit, posix\natexit.register(posix._exit, 0)\n",
        "atexit sys.exit(0)": "import atexit, sys\natexit.register(sys.exit, 0)\n",
        "weakref.finalize posix._exit(0)": "import posix, sys, weakref\nweakref.finalize(sys, posix._exit, 0)\n",
    }
    tries = [Try(klass, name, _forger(tail, []), _verdict_judge(), model=True) for name, tail in exits.items()]
    tries += [Try(klass, "os.chdir at import, -o report.sarif", _forger(chdir, ["-o", "report.sarif", "--output-format",
                                                                                "sarif"]),
                  _verdict_judge("report.sarif"), model=True),
              Try(klass, "os.chdir at import, --write-baseline b.json",
                  _forger(chdir, ["--write-baseline", "b.json"]), _verdict_judge_baseline, model=True)]
    return tries


def _verdict_judge_baseline(directory: str, run: Run) -> Optional[str]:
    text = _read(os.path.join(directory, "b.json")) or ""
    if run.rc != 0 or "PCL101" not in text:
        return f"exit {run.rc}; b.json in the project holds {text[:40]!r}; elsewhere: {os.listdir(os.path.join(directory, 'elsewhere'))}"
    return None


def tries() -> List[Try]:
    return (_planted_tries() + _edited_tries() + _read_tries() + _output_tries() + _fix_tries()
            + _link_on_the_way_tries() + _glob_tries() + _verdict_tries())


def run_try(one: Try, root: str) -> dict:
    directory = tempfile.mkdtemp(prefix="preclint-untrusted-")
    try:
        args = one.setup(directory, root)
        outcome = preclint(directory, args, root, model=one.model)
        problem = one.judge(directory, outcome)
        return {"class": one.klass, "name": one.name, "ok": problem is None, "problem": problem, "rc": outcome.rc,
                "seconds": round(outcome.seconds, 1), "stderr": outcome.stderr.strip().splitlines()[-1:] and
                outcome.stderr.strip().splitlines()[-1][:200]}
    finally:
        subprocess.run(["chattr", "-R", "-i", directory], capture_output=True) if os.geteuid() == 0 else None
        for where, dirs, _ in os.walk(directory):  # a directory given away must be walkable to be removed
            for name in dirs:
                os.chmod(os.path.join(where, name), 0o700)
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--root", default=ROOT, help="the preclint checkout to run (default: this one)")
    parser.add_argument("--out", help="a JSON file to store the outcomes in, under --label")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--classes", nargs="*", help="only the classes whose name starts with one of these")
    args = parser.parse_args()
    global ENCODE
    sys.path.insert(0, os.path.abspath(args.root))
    try:
        from preclint.source.cache import encode_document as ENCODE
    except ImportError:
        ENCODE = None
    chosen = [t for t in tries() if (not t.root_only or os.geteuid() == 0)
              and (not args.classes or t.klass.startswith(tuple(args.classes)))]
    with ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda t: run_try(t, os.path.abspath(args.root)), chosen))
    by_class: Counter = Counter()
    good: Counter = Counter()
    for outcome in outcomes:
        by_class[outcome["class"]] += 1
        good[outcome["class"]] += outcome["ok"]
        if not outcome["ok"]:
            print(f"  {outcome['class']}: {outcome['name']}: {outcome['problem']}")
    for klass in by_class:
        print(f"{klass}: {good[klass]}/{by_class[klass]} as they should be")
    if args.out:
        # (the commit checked is --root's, which may be another checkout than this script's)
        store_labelled(args.out, args.label, stamp({
            "root": os.path.abspath(args.root), "commit": git_commit(os.path.abspath(args.root)),
            "as_root": os.geteuid() == 0, "outcomes": outcomes,
            "summary": {k: f"{good[k]}/{by_class[k]}" for k in by_class}}))

if __name__ == "__main__":
    main()
