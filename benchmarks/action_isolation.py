"""What a pull request's files and a workflow's inputs can do to preclint's GitHub Action and its
pre-commit hook, tried class by class as a CI run meets them: the action's steps (scripts/github_action.py)
run as the action.yml of the checkout under test runs them (its `python` flags, the checkout as
working directory, the runner's variables, a pull request's event), the hook as pre-commit composes
it from .pre-commit-hooks.yaml (entry, args, the staged files' names).

The classes: a pull request's module that Python finds before the real one (from the working
directory, the job's PYTHONPATH, the user's site-packages), in the install and in the source check;
an input with a quote left open; what the install asks a package index for; what pull_request_target
refuses; a committed file whose name reads as an option of the hook. A try is as it should be when
none of the pull request's code ran, the verdict is the findings' (exit-code 1, the finding
reported), a mistake is one `::error` line and exit 2, and preclint is installed from the action's
own copy. The outcomes go to a JSON file under ``--label``, so that two runs sit side by side:

    git worktree add /tmp/before <commit>   # the action before the change
    python benchmarks/action_isolation.py --label before --root /tmp/before --out benchmarks/results/action_isolation.json
    python benchmarks/action_isolation.py --label after --out benchmarks/results/action_isolation.json

The source check runs in one virtual environment holding preclint's source side, built once from
this checkout (pip, from the package index: about 20 s); the install tries build one each. Nothing
is installed by name: the tries of what the install asks for record pip's command line instead of
running it.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional
from unittest import mock

if __package__ in (None, ""):  # run as a script: the repository root, for benchmarks.provenance
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import git_commit, stamp, store_labelled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n"
RAN = "the pull request's {} ran"


@dataclass
class Try:
    klass: str
    name: str
    run: Callable[["Checkout", str], Optional[str]]  # (the checkout under test, scratch) -> None, or what went wrong


@dataclass
class Checkout:
    """The preclint checkout whose action and hook are tried, and the source side's Python."""
    root: str
    python: str
    runner_flags: List[str] = field(default_factory=list)  # how its action.yml starts the step script

    @property
    def script(self) -> str:
        return os.path.join(self.root, "scripts", "github_action.py")


def _hostile(name: str, directory: str, exit_zero: bool = False) -> str:
    """Python that leaves a mark when it runs (and, as a forged __main__, ends at once with exit 0)."""
    mark = os.path.join(directory, "RAN-" + name.replace("/", "."))
    return f"open({mark!r}, 'a').close()\n" + ("raise SystemExit(0)\n" if exit_zero else "")


def _marks(directory: str) -> List[str]:
    return sorted(name[4:] for name in os.listdir(directory) if name.startswith("RAN-"))


def _git(repo: str, *args: str) -> str:
    return subprocess.run(["git", "-C", repo, "-c", "user.email=ci@example.com", "-c", "user.name=ci", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def pull_request(scratch: str, files: Dict[str, str]) -> str:
    """A repository whose pull request adds new.py (a PCL502 finding) and ``files``; the event beside it."""
    repo = os.path.join(scratch, "repo")
    os.makedirs(repo)
    _git(repo, "init", "-q")
    with open(os.path.join(repo, "clean.py"), "w") as handle:
        handle.write("x = 1\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    for name, text in {"new.py": AMP, **files}.items():
        path = os.path.join(repo, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as handle:
            handle.write(text)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "the pull request")
    with open(os.path.join(scratch, "event.json"), "w") as handle:
        json.dump({"pull_request": {"base": {"sha": base}}}, handle)
    os.makedirs(os.path.join(scratch, "runner"))
    return repo


def step(checkout: Checkout, repo: str, name: str, *args: str, job: Optional[Dict[str, str]] = None,
         event: str = "pull_request", **inputs: str):
    """One step of the action as its action.yml runs it; returns (the process, its outputs)."""
    scratch = os.path.dirname(repo)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("INPUT_")}
    env.update({"GITHUB_EVENT_NAME": event, "GITHUB_EVENT_PATH": os.path.join(scratch, "event.json"),
                "GITHUB_OUTPUT": os.path.join(scratch, "output"), "RUNNER_TEMP": os.path.join(scratch, "runner"),
                "PRECLINT_CACHE_DIR": os.path.join(scratch, "cache"), "NO_COLOR": "1", **(job or {})})
    env.update({f"INPUT_{key.upper()}": value for key, value in inputs.items()})
    open(env["GITHUB_OUTPUT"], "w").close()
    done = subprocess.run([sys.executable, *checkout.runner_flags, checkout.script, name, *args], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    with open(env["GITHUB_OUTPUT"]) as handle:
        outputs = dict(line.split("=", 1) for line in handle.read().splitlines() if "=" in line)
    return done, outputs


# ---- a pull request's module in the source check ---------------------------------------------------

def _source_check(files: Dict[str, str], job: Callable[[str], Dict[str, str]] = lambda repo: {}):
    def run(checkout: Checkout, scratch: str) -> Optional[str]:
        repo = pull_request(scratch, {name: text.replace("@SCRATCH@", scratch) for name, text in files.items()})
        variables = job(repo)
        paths, _ = step(checkout, repo, "paths", job=variables)
        done, outputs = step(checkout, repo, "check", "--python", checkout.python, job=variables)
        if _marks(scratch):
            return RAN.format(", ".join(_marks(scratch)))
        if "Traceback" in paths.stderr + done.stderr:
            return "a traceback: " + (paths.stderr + done.stderr).strip().splitlines()[-1][:160]
        if outputs.get("exit-code") != "1" or "::warning file=new.py," not in done.stdout:
            return f"the verdict is not the findings': exit-code={outputs.get('exit-code')}, new.py's finding " + \
                   ("reported" if "file=new.py" in done.stdout else "missing")
        return None
    return run


def _module(name: str, exit_zero: bool = False) -> Dict[str, str]:
    marker = _hostile(name, "@SCRATCH@", exit_zero)
    if name.endswith("/"):  # a package, and for preclint/ and pip/ a __main__ that ends at once
        return {name + "__init__.py": marker, name + "__main__.py": _hostile(name + "__main__", "@SCRATCH@", True)}
    return {name: marker}


def _pythonpath(relative: bool = False):
    return lambda repo: {"PYTHONPATH": "." if relative else repo}


def _user_base(repo: str) -> Dict[str, str]:
    return {"PYTHONUSERBASE": os.path.join(repo, ".userbase")}


def _user_site_files() -> Dict[str, str]:
    import sysconfig

    site = sysconfig.get_path("purelib", f"{os.name}_user", vars={"userbase": ".userbase"})
    return {os.path.join(site, "usercustomize.py"): _hostile("usercustomize.py", "@SCRATCH@")}


def source_tries() -> List[Try]:
    cwd = "source check: the checkout's module (working directory)"
    path = "source check: the checkout's module (the job's PYTHONPATH)"
    user = "source check: the user's site-packages (the job's PYTHONUSERBASE)"
    tries = [Try(cwd, name, _source_check(_module(name))) for name in
             ("argparse.py", "json.py", "enum.py", "libcst.py", "rich/", "typing_extensions.py", "preclint/")]
    tries += [Try(path, name, _source_check(_module(name), _pythonpath())) for name in
              ("sitecustomize.py", "re.py", "json.py", "libcst.py", "rich/", "preclint/")]
    tries += [Try(path, name + " (PYTHONPATH=.)", _source_check(_module(name), _pythonpath(relative=True))) for name in
              ("sitecustomize.py", "json.py", "preclint/")]
    tries.append(Try(user, "usercustomize.py", _source_check(_user_site_files(), _user_base)))
    return tries


# ---- a pull request's module in the install --------------------------------------------------------

def _install(files: Dict[str, str], job: Callable[[str], Dict[str, str]] = lambda repo: {}):
    def run(checkout: Checkout, scratch: str) -> Optional[str]:
        repo = pull_request(scratch, {name: text.replace("@SCRATCH@", scratch) for name, text in files.items()})
        done, outputs = step(checkout, repo, "install", job=job(repo))
        if _marks(scratch):
            return RAN.format(", ".join(_marks(scratch)))
        if done.returncode != 0 or "python" not in outputs:
            return f"the install failed (exit {done.returncode}): " + (done.stdout + done.stderr).strip()[-160:]
        found = subprocess.run([outputs["python"], "-I", "-c", "import preclint, libcst"], capture_output=True)
        return None if found.returncode == 0 else "the environment has no preclint"
    return run


def install_tries() -> List[Try]:
    cwd = "install: the checkout's module (working directory)"
    path = "install: the checkout's module (the job's PYTHONPATH)"
    return [Try(cwd, "pip/", _install(_module("pip/"))),
            Try(path, "json.py", _install(_module("json.py"), _pythonpath())),
            Try(path, "sitecustomize.py", _install(_module("sitecustomize.py"), _pythonpath())),
            Try(path, "setuptools.py", _install(_module("setuptools.py"), _pythonpath())),
            Try(path, "pip/", _install(_module("pip/"), _pythonpath()))]


# ---- inputs ----------------------------------------------------------------------------------------

def _input(step_name: str, **inputs: str):
    def run(checkout: Checkout, scratch: str) -> Optional[str]:
        repo = pull_request(scratch, {})
        with open(os.path.join(scratch, "runner", "preclint-paths.json"), "w") as handle:
            handle.write('["new.py"]')
        args = ["--python", checkout.python] if step_name == "check" else []
        done, _ = step(checkout, repo, step_name, *args, **inputs)
        lines = done.stdout.splitlines()
        if "Traceback" in done.stderr:
            return "a traceback: " + done.stderr.strip().splitlines()[-1][:160]
        if done.returncode != 2 or len(lines) != 1 or not lines[0].startswith("::error "):
            return f"exit {done.returncode}, {len(lines)} line(s) on stdout"
        return None
    return run


def input_tries() -> List[Try]:
    klass = "inputs: a quote left open"
    return [Try(klass, "paths", _input("paths", paths="src 'my file.py")),
            Try(klass, "paths, a trailing backslash", _input("paths", paths="new.py \\")),
            Try(klass, "args", _input("check", args="--select 'PCL5")),
            Try(klass, "models, line 2", _input("check", models='net.py\nb.py --model "Net'))]


# ---- what the install asks for, and pull_request_target, with pip's command line recorded ---------------

def _in_process(checkout: Checkout, scratch: str, argv: List[str], event: str, inputs: Dict[str, str]):
    """The label's step script, imported, with subprocess.run and venv recording instead of running;
    returns (exit code, stdout, the recorded pip command lines)."""
    spec = importlib.util.spec_from_file_location(f"action_{abs(hash(checkout.root))}", checkout.script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    commands: List[List[str]] = []

    def record(command, **kw):
        commands.append(list(command))
        return subprocess.CompletedProcess(command, 0, "", "")

    builder = type("Builder", (), {"create": lambda self, directory: None})
    saved = dict(os.environ), os.getcwd()
    os.environ.update({"GITHUB_EVENT_NAME": event, "RUNNER_TEMP": scratch, "GITHUB_OUTPUT": os.path.join(scratch, "o"),
                       "GITHUB_EVENT_PATH": os.path.join(scratch, "event.json"),
                       **{f"INPUT_{k.upper().replace('-', '_')}": v for k, v in inputs.items()}})
    with open(os.path.join(scratch, "event.json"), "w") as handle:
        json.dump({"pull_request": {"base": {"sha": "0" * 40}}}, handle)
    with open(os.path.join(scratch, "preclint-paths.json"), "w") as handle:
        handle.write('["."]')
    stdout = io.StringIO()
    try:  # (module.subprocess is this process's subprocess module: patched for the call only)
        with mock.patch.object(module.subprocess, "run", record), \
                mock.patch.object(module.venv, "EnvBuilder", lambda **kw: builder()), contextlib.redirect_stdout(stdout):
            code = module.main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        os.chdir(saved[1])
    return code, stdout.getvalue(), commands


def _asks_index_for(version: str, kind: str):
    def run(checkout: Checkout, scratch: str) -> Optional[str]:
        # action.yml passes version only where the action has the input
        inputs = {"install": kind, **({"version": version} if _has_input(checkout, "version") else {})}
        code, stdout, commands = _in_process(checkout, scratch, ["install"], "pull_request", inputs)
        if code != 0:
            return f"exit {code}: {stdout.strip()[:160]}"
        named = [word for command in commands for word in command if word.lower().startswith("preclint")]
        if named:
            return f"pip is asked for {named[0]!r} from the package index"
        if not any(checkout.root.rstrip("/") in word for command in commands for word in command):
            return "pip is not given the action's own copy"
        return None
    return run


def _has_input(checkout: Checkout, name: str) -> bool:
    import yaml

    with open(os.path.join(checkout.root, "action.yml")) as handle:
        return name in yaml.safe_load(handle)["inputs"]


def _refused_on_pull_request_target(argv: List[str], **inputs: str):
    def run(checkout: Checkout, scratch: str) -> Optional[str]:
        code, stdout, commands = _in_process(checkout, scratch, argv, "pull_request_target", inputs)
        if code == 2 and stdout.startswith("::error ") and not commands:
            return None
        return f"accepted (exit {code}, {len(commands)} command(s) started)"
    return run


def static_tries() -> List[Try]:
    index = "install: a name from a package index"
    target = "pull_request_target: what runs the pull request's code, or records its analysis as the base's"
    return [Try(index, f"version: {version or '(none)'}, install: {kind}", _asks_index_for(version, kind))
            for version in ("", "latest", "0.1.0") for kind in ("source", "full")] + [
        Try(target, "install: full", _refused_on_pull_request_target(["install"], install="full")),
        Try(target, "install: full, models", _refused_on_pull_request_target(["install"], install="full", models="n.py")),
        Try(target, "report: sarif", _refused_on_pull_request_target(["check", "--python", sys.executable],
                                                                     report="sarif"))]


# ---- the pre-commit hook ------------------------------------------------------------------------------

def _hook(files: Dict[str, str], pythonpath: bool = False):
    """preclint-source as pre-commit runs it: the entry's words, the hook's args, the files' names
    sorted; ``python`` and ``preclint`` are the source side's environment's."""
    def run(checkout: Checkout, scratch: str) -> Optional[str]:
        import yaml

        with open(os.path.join(checkout.root, ".pre-commit-hooks.yaml")) as handle:
            hook = {h["id"]: h for h in yaml.safe_load(handle)}["preclint-source"]
        words = shlex.split(hook["entry"])
        bin_dir = os.path.dirname(checkout.python)
        words[0] = os.path.join(bin_dir, words[0])
        for name, text in {"train.py": AMP, **files}.items():
            with open(os.path.join(scratch, name), "w") as handle:
                handle.write(text.replace("@SCRATCH@", scratch))
        names = sorted(os.listdir(scratch))
        env = dict(os.environ, NO_COLOR="1", PRECLINT_CACHE_DIR=os.path.join(scratch, ".cache"))
        env.pop("PYTHONPATH", None)
        if pythonpath:
            env["PYTHONPATH"] = scratch
        done = subprocess.run([*words, *hook.get("args", []), *names], cwd=scratch, env=env,
                              capture_output=True, text=True, timeout=120)
        if _marks(scratch):
            return RAN.format(", ".join(_marks(scratch)))
        if done.returncode != 1 or "train.py:3:6: PCL502" not in done.stdout:
            return f"exit {done.returncode}, the finding {'reported' if 'PCL502' in done.stdout else 'missing'}: " + \
                   ((done.stdout + done.stderr).strip().splitlines() or [""])[-1][:120]
        return None
    return run


def hook_tries() -> List[Try]:
    names = "pre-commit hook: a committed file named as an option"
    path = "pre-commit hook: the checkout's module (PYTHONPATH)"
    toml = '[tool.preclint]\nignore = ["PCL5"]\n'  # Python and TOML at once
    return [Try(names, "--config=cfg.py and cfg.py", _hook({"--config=cfg.py": "x = 1\n", "cfg.py": toml})),
            Try(names, "--exit-zero (a shebang)", _hook({"--exit-zero": "#!/usr/bin/env python\nx = 1\n"})),
            Try(names, "--fail-on=error (a shebang)", _hook({"--fail-on=error": "#!/usr/bin/env python\nx = 1\n"})),
            Try(names, "--select=PCL9.py", _hook({"--select=PCL9.py": "x = 1\n"})),
            Try(path, "libcst.py", _hook(_module("libcst.py"), pythonpath=True)),
            Try(path, "sitecustomize.py", _hook(_module("sitecustomize.py"), pythonpath=True))]


# ---------------------------------------------------------------------------------------------------------

def tries() -> List[Try]:
    return source_tries() + input_tries() + static_tries() + hook_tries() + install_tries()


def source_side(scratch: str) -> str:
    """A virtual environment with this checkout's preclint and the source side's packages, built isolated."""
    directory = os.path.join(scratch, "source-venv")
    subprocess.run([sys.executable, "-I", "-m", "venv", directory], check=True, cwd=scratch)
    python = os.path.join(directory, "bin", "python")
    subprocess.run([python, "-I", "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", ROOT,
                    "-r", os.path.join(ROOT, "scripts", "action-source-requirements.txt")], check=True, cwd=scratch)
    return python


def run_try(one: Try, checkout: Checkout) -> dict:
    scratch = tempfile.mkdtemp(prefix="preclint-action-")
    started = time.perf_counter()
    try:
        problem = one.run(checkout, scratch)
    except Exception as exc:  # a try that cannot run is a failed try, said so
        problem = f"the try failed: {type(exc).__name__}: {exc}"[:200]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"class": one.klass, "name": one.name, "ok": problem is None, "problem": problem,
            "seconds": round(time.perf_counter() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True)
    parser.add_argument("--root", default=ROOT, help="the preclint checkout whose action and hook to try")
    parser.add_argument("--python", help="a source side's Python to reuse (default: build one from this checkout)")
    parser.add_argument("--out", help="a JSON file to store the outcomes in, under --label")
    parser.add_argument("--only", help="the tries whose class holds this text")
    args = parser.parse_args()
    root = os.path.abspath(args.root)
    with open(os.path.join(root, "action.yml")) as handle:
        flags = ["-I"] if '" -I "$GITHUB_ACTION_PATH' in handle.read() else []
    scratch = tempfile.mkdtemp(prefix="preclint-action-venv-")
    python = args.python or source_side(scratch)
    checkout = Checkout(root, python, flags)
    outcomes = []
    for one in tries():
        if args.only and args.only not in one.klass:
            continue
        outcomes.append(run_try(one, checkout))
        outcome = outcomes[-1]
        print(f"{'ok  ' if outcome['ok'] else 'FAIL'} {one.klass}: {one.name}" +
              ("" if outcome["ok"] else f": {outcome['problem']}"), flush=True)
    by_class: Counter = Counter()
    good: Counter = Counter()
    for outcome in outcomes:
        by_class[outcome["class"]] += 1
        good[outcome["class"]] += outcome["ok"]
    for klass in by_class:
        print(f"{klass}: {good[klass]}/{by_class[klass]} as they should be")
    if args.out:
        # (the commit tried is --root's, which may be another checkout than this script's)
        store_labelled(args.out, args.label, stamp({
            "root": root, "commit": git_commit(root), "runner_flags": flags, "outcomes": outcomes,
            "tries": len(outcomes), "as_they_should_be": sum(good.values()),
            "summary": {k: f"{good[k]}/{by_class[k]}" for k in by_class}}))
    shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
