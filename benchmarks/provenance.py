"""Where a benchmark result came from: the commit, the command, the machine and the date.

Every benchmark that writes a result calls ``stamp`` on it, so that each figure quoted from
benchmarks/results/ can be traced (benchmarks/CLAIMS.md):

    {"provenance": {"commit": "0b5fe59...", "command": "python benchmarks/probe.py speed ...",
                    "machine": {"platform": ..., "python": ..., "cpu_count": ..., "torch": ...,
                                "cuda": ..., "gpus": [...]},
                    "date": "2026-12-02T10:11:12+00:00"}, ...the result...}

The commit is ``git rev-parse HEAD`` of the checkout this file is in, with ``-dirty`` when a file
outside benchmarks/results/ differs from it or is new and not ignored (``git status``; a result being
written is no change to the code that measured it). Git runs nothing else. Where the launcher sets
``$BENCHMARK_COMMIT`` (``BENCHMARK_COMMIT=$(git rev-parse HEAD)`` where a copy of the tree was made for
a GPU machine), that is the commit, and the record says so: such a copy can hold no repository, or one
whose HEAD is another commit. Else, without a repository, it is ``None``. A process records one provenance, taken when it imports this module, as the run begins: a
result written at the end of a run says what the tree was when it started, whatever was edited
while it ran.
"""
from __future__ import annotations

import datetime
import functools
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

ROOT = Path(__file__).resolve().parent.parent
COMMIT_VARIABLE = "BENCHMARK_COMMIT"
# results written while a run goes on do not make the code that measured them a changed one
RESULTS = "benchmarks/results"


def stamp(result: Dict[str, Any]) -> Dict[str, Any]:
    """``result`` with this run's provenance as its first key (replacing any it had)."""
    return {"provenance": run_provenance(), **{k: v for k, v in result.items() if k != "provenance"}}


def write_stamped(result: Dict[str, Any], path: Optional[str]) -> None:
    """``result`` (stamped already) printed as JSON, and written to ``path`` where one is given."""
    text = json.dumps(result, indent=1)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)


def store_labelled(path, label: str, record: Dict[str, Any]) -> None:
    """``record`` under ``label`` in the JSON file ``path``, beside the labels other runs stored there
    (a "before" and an "after" side by side); the file's own provenance is this run's."""
    stored: Dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as handle:
            stored = json.load(handle)
    stored[label] = record
    with open(path, "w") as out:
        json.dump(stamp(stored), out, indent=1)
        out.write("\n")


def run_provenance() -> Dict[str, Any]:
    """This process's provenance, taken once (at import, see the end of this module)."""
    return dict(_taken_once(str(ROOT)))


@functools.lru_cache(maxsize=None)
def _taken_once(root: str) -> Dict[str, Any]:
    return provenance(Path(root))


def provenance(root: Path = ROOT) -> Dict[str, Any]:
    """commit, command, machine and date, taken now."""
    record: Dict[str, Any] = {"commit": None, "command": command_line(), "machine": machine(),
                              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    # the launcher's word wins: a copy of the tree (the GPU machine's) can carry a repository whose
    # HEAD is not the commit the copy was made from
    if os.environ.get(COMMIT_VARIABLE):
        record["commit"] = os.environ[COMMIT_VARIABLE].strip()
        record["commit_from"] = f"${COMMIT_VARIABLE}, as the launcher gave it"
        return record
    record["commit"] = git_commit(root)
    return record


def command_line() -> str:
    """The command as it was typed (``python -m benchmarks.fuzz ...``, not the module's path); under
    torchrun, the rank's own command with the launch's size."""
    argv: List[str] = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if argv and os.path.isabs(argv[0]):
        argv[0] = os.path.basename(argv[0])
    text = shlex.join(argv)
    if os.environ.get("WORLD_SIZE") and os.environ.get("RANK") is not None:
        text += f"  # under torchrun: rank {os.environ['RANK']} of {os.environ['WORLD_SIZE']}"
    return text


def machine() -> Dict[str, Any]:
    """Platform, Python, cores, and torch, CUDA and the GPUs where there are. torch is read only if
    the benchmark imported it; the GPUs are asked of torch where it set CUDA up, else of nvidia-smi,
    so that asking never starts CUDA in a process that forks."""
    info: Dict[str, Any] = {"platform": platform.platform(), "python": platform.python_version(),
                            "cpu_count": os.cpu_count()}
    torch = sys.modules.get("torch")
    info["torch"] = torch.__version__ if torch is not None else _installed_version("torch")
    gpus = _gpus(torch)
    if gpus:
        info["gpus"] = gpus
        if torch is not None:
            info["cuda"] = torch.version.cuda
    return info


def git_commit(root: Path) -> Optional[str]:
    """``git rev-parse HEAD`` of ``root``, ``-dirty`` when a file outside the results differs
    from it or is new; None where git or the repository (this one, not one above it) is missing."""
    found = _git(root, "rev-parse", "--show-toplevel", "HEAD")
    lines = found.splitlines() if found else []
    # a copy of the tree inside some other repository is not that repository's commit
    if len(lines) != 2 or Path(lines[0]).resolve() != Path(root).resolve():
        return None
    head = lines[1]
    changed = _git(root, "--no-optional-locks", "-c", "core.fsmonitor=false", "status", "--porcelain",
                   "--untracked-files=normal", "--", ".", f":(exclude){RESULTS}")
    return head + ("-dirty" if changed else "")


def _git(root: Path, *args: str) -> Optional[str]:
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _gpus(torch) -> List[str]:
    if torch is not None and torch.cuda.is_initialized():
        return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def _installed_version(package: str) -> Optional[str]:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:
        return None
    try:
        return version(package)
    except PackageNotFoundError:
        return None


# taken as the run begins (a benchmark imports this before it measures), not when it first writes
run_provenance()
