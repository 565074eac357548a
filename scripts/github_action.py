"""The steps of preclint's GitHub Action (action.yml at the repository root), one subcommand each:

    python -I scripts/github_action.py install   # a virtual environment with the source side, or the whole tool
    python -I scripts/github_action.py paths     # what to check: the given paths, or a pull request's changed files
    python -I scripts/github_action.py check     # preclint check on them (and on the named models); the report

The action passes its inputs as environment variables (``INPUT_INSTALL``, ``INPUT_PATHS``,
``INPUT_ARGS``, ``INPUT_FAIL_ON``, ``INPUT_MODELS``, ``INPUT_REPORT``), never spliced into a shell
line, so that no input and no file name becomes a command.

No Python the action starts imports anything from the checkout it reads: each runs isolated (``-I``:
neither the working directory, nor ``PYTHONPATH``, nor the user's site-packages is on ``sys.path``,
and no ``PYTHON*`` variable is read), and the processes those start (pip's builds, preclint's
workers) get the job's environment without its ``PYTHON*`` variables. The install runs from a
directory outside the checkout, and installs preclint from the action's own copy (the tag or commit
the workflow pinned), never a name from a package index. The steps read what
the runner sets (``GITHUB_EVENT_NAME``, ``GITHUB_EVENT_PATH``, ``GITHUB_OUTPUT``, ``RUNNER_TEMP``) and
write their outputs to ``GITHUB_OUTPUT``; run anywhere else with those set, they do the same
(tests/project/test_github_action.py runs them so, in a clean virtual environment, on a sample
repository). The standard library only: this runs on the runner's own Python, before preclint is
installed.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import venv
from typing import List, Optional, Sequence

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the action's own copy of preclint
SOURCE_REQUIREMENTS = ROOT / "scripts" / "action-source-requirements.txt"
REPORTS = ("annotations", "sarif", "rdjson")
FORMATS = {"annotations": "github", "sarif": "sarif", "rdjson": "rdjson"}
COMMIT = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git object name, as the event gives the base commit
CHECKED_SUFFIXES = (".py", ".pyi")  # what a source-only run reads


class ActionError(Exception):
    """A mistake in the workflow's inputs: one line, as a workflow error annotation, and exit 2."""


def _input(name: str, default: str = "") -> str:
    return os.environ.get(f"INPUT_{name.upper().replace('-', '_')}", default).strip()


def shell_words(name: str, text: str) -> List[str]:
    """An input read as shell words (quote a name with spaces); a quote left open is the workflow's
    mistake, one line."""
    try:
        return shlex.split(text)
    except ValueError as exc:  # "No closing quotation", "No escaped character"
        raise ActionError(f"{name}: {exc} in {text!r}") from None


def annotation(message: str) -> str:
    """A workflow error command: % and line breaks escaped as the runner reads them back."""
    for raw, escaped in (("%", "%25"), ("\r", "%0D"), ("\n", "%0A")):
        message = message.replace(raw, escaped)
    return f"::error title=preclint action::{message}"


def isolated(python: str, *args: str) -> List[str]:
    """A command line for ``python`` that imports nothing from the checkout: ``-I`` leaves the working
    directory (which ``-m`` and ``-c`` put first on sys.path), ``PYTHONPATH`` and the user's
    site-packages (with its usercustomize) off sys.path, and every ``PYTHON*`` variable unread. What it
    keeps: the interpreter's own site-packages, with their ``.pth`` files and sitecustomize, which is
    where the job installed what the graph check of ``models`` imports."""
    return [python, "-I", *args]


def child_environment() -> dict:
    """The job's environment for the processes the action starts, less the ``PYTHON*`` variables
    (``PYTHONPATH``, ``PYTHONSTARTUP``, ``PYTHONUSERBASE``, ...): ``-I`` makes the first Python
    ignore them, and this keeps them from the Pythons it starts in turn (pip's build backend,
    preclint's workers)."""
    return {key: value for key, value in os.environ.items() if not key.upper().startswith("PYTHON")}


def _temp() -> pathlib.Path:
    return pathlib.Path(os.environ.get("RUNNER_TEMP") or os.environ.get("TMPDIR") or "/tmp")


def set_output(name: str, value: str) -> None:
    """A step output (``$GITHUB_OUTPUT``), or a line on stdout where there is none."""
    if "\n" in value or "\r" in value:
        raise ActionError(f"output {name} would hold a line break")
    target = os.environ.get("GITHUB_OUTPUT")
    if target:
        with open(target, "a", encoding="utf-8") as stream:
            stream.write(f"{name}={value}\n")
    else:
        print(f"{name}={value}")


def _venv_python(directory: pathlib.Path) -> pathlib.Path:
    windows = directory / "Scripts" / "python.exe"
    return windows if windows.exists() else directory / "bin" / "python"


def _pip(python: str, *args: str) -> None:
    """pip, isolated and started in the runner's temporary directory: a checkout's ``pip/`` or
    ``argparse.py`` is not on its path, nor on that of the build it starts."""
    command = isolated(python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args)
    subprocess.run(command, check=True, cwd=_temp(), env=child_environment())


def install(kind: str, models: str) -> str:
    """Install preclint from the action's own copy (the tag or commit the workflow pinned; there is no
    release to install by name, and a name an index may hand anyone is not installed); returns the
    Python that runs it. ``source``: a virtual environment of its own holding preclint without its
    dependencies and the source side's (libcst, rich): no torch, a few megabytes. ``full``: the whole
    tool, into the Python on PATH (the job's, where the models' packages are installed: the graph
    check imports them)."""
    if kind not in ("source", "full"):
        raise ActionError(f"install must be source or full, not {kind!r}")
    if kind == "full" and os.environ.get("GITHUB_EVENT_NAME") == "pull_request_target":
        raise ActionError("install full runs preclint in the job's Python, whose packages a job that installed the "
                          "pull request's project runs at start-up, and models run the pull request's code; "
                          "pull_request_target would run it with this repository's token and secrets: use "
                          "install source, and check models on pull_request")
    if models and kind != "full":
        raise ActionError("models are checked by the graph check, which imports torch and your code: "
                          "set install: full (in a job that has installed your project)")
    os.chdir(_temp())  # venv's ensurepip starts a Python in the working directory: not the checkout
    if kind == "full":
        _pip(sys.executable, str(ROOT))
        return sys.executable
    directory = _temp() / "preclint-venv"
    venv.EnvBuilder(clear=True, with_pip=True).create(directory)
    python = str(_venv_python(directory))
    # one pip run, all --no-deps, as the pre-commit hook's: the list is closed, and pip does not
    # complain that preclint's own torch is missing
    _pip(python, "--no-deps", str(ROOT), "-r", str(SOURCE_REQUIREMENTS))
    return python


def _git(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, check=check)


def _pull_request_base() -> Optional[str]:
    if os.environ.get("GITHUB_EVENT_NAME") not in ("pull_request", "pull_request_target"):
        return None
    event_path = os.environ.get("GITHUB_EVENT_PATH")
    if not event_path:
        return None
    with open(event_path, encoding="utf-8") as stream:
        event = json.load(stream)
    base = ((event.get("pull_request") or {}).get("base") or {}).get("sha")
    if base is not None and not (isinstance(base, str) and COMMIT.fullmatch(base)):
        raise ActionError(f"the event's pull_request.base.sha is not a commit: {base!r}")
    return base


def changed_files(base: str) -> List[str]:
    """The Python files a pull request adds, copies, modifies or renames: the difference between its
    base commit and the checked-out commit (fetched when the checkout is shallow). Names are read
    NUL-separated, so any name a commit can hold comes through whole."""
    if _git("cat-file", "-e", f"{base}^{{commit}}", check=False).returncode != 0:
        _git("fetch", "--no-tags", "--depth=1", "origin", base)
    listed = _git("-c", "core.quotepath=off", "diff", "--name-only", "--diff-filter=ACMR", "-z", base, "HEAD", "--")
    names = [os.fsdecode(name) for name in listed.stdout.split(b"\0") if name]
    return [name for name in names if name.endswith(CHECKED_SUFFIXES) and os.path.isfile(name)]


def select_paths(paths: str, report: str) -> Optional[List[str]]:
    """The paths the source check reads: the ``paths`` input (shell words: quote a name with spaces);
    else, for annotations and reviewdog, the changed files of a pull request; else the whole checkout.
    Code scanning (sarif) compares a pull request's analysis with its base branch's, so it gets the
    whole checkout: an analysis of the changed files alone would show every other alert as fixed.
    None: a pull request that changes no Python file (nothing to check)."""
    if paths:
        return shell_words("paths", paths)
    base = _pull_request_base()
    if base is None or report == "sarif":
        return ["."]
    return changed_files(base) or None


def model_runs(models: str) -> List[List[str]]:
    """One argument list per line of the ``models`` input (``models/net.py --model Net --input
    1x3x224x224``); blank lines and ``#`` comments left out."""
    return [shell_words(f"models, line {number}", line) for number, line in enumerate(models.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")]


def _options(args: str, fail_on: str) -> List[str]:
    options = shell_words("args", args)
    if fail_on:
        if fail_on not in ("info", "warning", "error"):
            raise ActionError(f"fail-on must be info, warning or error, not {fail_on!r}")
        options += ["--fail-on", fail_on]
    return options


def _worst(codes: Sequence[int]) -> int:
    """The step's exit code: 2 (a run that failed) over 1 (findings) over 0."""
    return 2 if any(code not in (0, 1) for code in codes) else max(codes, default=0)


def _merge(kind: str, documents: List[dict]) -> dict:
    """One report of the runs: SARIF runs side by side, each its own category (GitHub takes one run per
    tool and category); reviewdog's diagnostics in one list."""
    if kind == "sarif":
        merged = dict(documents[0])
        merged["runs"] = [run for document in documents for run in document["runs"]]
        return merged
    return {"source": {"name": "preclint"}, "diagnostics": [d for doc in documents for d in doc["diagnostics"]]}


def _read_report(target: pathlib.Path, name: str, report: str) -> Optional[dict]:
    """A run's report, its SARIF runs given their category; None (and one error line) where it is not
    the JSON document preclint writes (a model's code can write over it)."""
    try:
        document = json.loads(target.read_text(encoding="utf-8"))
        if report == "sarif":
            for run in document["runs"]:
                run["automationDetails"] = {"id": f"preclint/{name}/"}
        elif not isinstance(document["diagnostics"], list):
            raise TypeError("diagnostics is not a list")
        return document
    except (ValueError, KeyError, TypeError) as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        print(annotation(f"the {name} run's {report} report {target} is not preclint's: {type(exc).__name__}: {exc}"))
        return None


def check(python: str, paths: Optional[List[str]], *, args: str, fail_on: str, models: str, report: str) -> int:
    """Run ``preclint check``: the source rules on ``paths`` (None: skipped) and the graph check on each
    model; annotations go to the log, a SARIF or rdjson report to a file (the ``report-file`` output).
    Returns the exit code the job ends with."""
    if report not in REPORTS:
        raise ActionError(f"report must be one of {', '.join(REPORTS)}, not {report!r}")
    if report == "sarif" and os.environ.get("GITHUB_EVENT_NAME") == "pull_request_target":
        raise ActionError("report sarif on pull_request_target would upload the pull request's analysis as the base "
                          "branch's (the event's ref and commit): upload on pull_request and push")
    options = _options(args, fail_on)
    runs: List[tuple] = []
    if paths is None:
        print("preclint: no Python file changed in this pull request; the source check has nothing to read")
    else:
        runs.append(("source", ["--source-only", *options, "--", *paths]))
    runs += [(f"model-{i}", [*arguments, *options]) for i, arguments in enumerate(model_runs(models), 1)]
    codes, documents = [], []
    directory = _temp() / "preclint-report"
    directory.mkdir(parents=True, exist_ok=True)
    environment = child_environment()
    for name, arguments in runs:
        # in the checkout (paths and models name its files), which -I keeps off sys.path
        command = isolated(python, "-m", "preclint", "check", "--output-format", FORMATS[report])
        if report == "annotations":
            codes.append(subprocess.run(command + arguments, env=environment).returncode)
            continue
        target = directory / f"{name}.{report}"
        target.unlink(missing_ok=True)
        codes.append(subprocess.run(command + ["--output", str(target), *arguments], env=environment).returncode)
        if target.exists():
            document = _read_report(target, name, report)
            if document is None:
                codes.append(2)
            else:
                documents.append(document)
    if documents:
        output = directory / f"preclint.{report}"
        output.write_text(json.dumps(_merge(report, documents), indent=2) + "\n", encoding="utf-8")
        set_output("report-file", str(output))
    code = _worst(codes)
    set_output("exit-code", str(code))
    return code


def _paths_file() -> pathlib.Path:
    return _temp() / "preclint-paths.json"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    sub.add_parser("install", help="install preclint (INPUT_INSTALL, INPUT_MODELS); output: python")
    sub.add_parser("paths", help="what to check (INPUT_PATHS, or a pull request's changed files)")
    step = sub.add_parser("check", help="run preclint check (INPUT_ARGS, INPUT_FAIL_ON, INPUT_MODELS, INPUT_REPORT)")
    step.add_argument("--python", required=True, help="the Python that runs preclint (install's output)")
    options = parser.parse_args(argv)
    try:
        if options.step == "install":
            set_output("python", install(_input("install", "source"), _input("models")))
            return 0
        if options.step == "paths":
            paths = select_paths(_input("paths"), _input("report", "annotations"))
            _paths_file().write_text(json.dumps(paths), encoding="utf-8")  # (ASCII: a lone surrogate as its escape)
            print(f"preclint: {'no changed Python file' if paths is None else f'{len(paths)} path(s)'} to check")
            return 0
        paths = json.loads(_paths_file().read_text(encoding="utf-8"))
        check(options.python, paths, args=_input("args"), fail_on=_input("fail-on"), models=_input("models"),
              report=_input("report", "annotations"))
        return 0  # the exit-code output: the action's last step ends with it, after the upload
    except ActionError as exc:
        print(annotation(str(exc)))
        return 2
    except subprocess.CalledProcessError as exc:
        print(annotation(f"{' '.join(map(str, exc.cmd[:5]))} ... failed with exit code {exc.returncode}"))
        return 2


if __name__ == "__main__":
    sys.exit(main())
