"""Case names to cases, and one case checked: what a worker process of the long run does, and what
tests/fuzz/test_fuzz.py does for its fixed sample.

A case is named ``model-SEED``, ``source-SEED`` or ``attack-SEED`` (benchmarks.fuzz.attacks); the name
alone rebuilds it on the same machine (the source corpus is fixed per run: ``own`` files, ``installed``
test files, or ``both``; installed files differ between machines, hence the kept copies of failing
cases: ``kept_path``).
"""
from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.fuzz.oracle import Checked, Verdict


@functools.lru_cache(maxsize=None)
def corpus(kind: str) -> Tuple[Path, ...]:
    from benchmarks.fuzz.sources import installed_test_files, own_files

    files: List[Path] = []
    if kind in ("own", "both"):
        files += own_files()
    if kind in ("installed", "both"):
        files += installed_test_files()
    return tuple(files)


def build(name: str, corpus_kind: str = "both"):
    kind, _, seed = name.rpartition("-")
    if kind == "model":
        from benchmarks.fuzz.models import model_case

        return model_case(int(seed))
    if kind == "source":
        from benchmarks.fuzz.sources import source_case

        return source_case(int(seed), corpus(corpus_kind))
    if kind == "attack":
        from benchmarks.fuzz.attacks import attack_case

        return attack_case(int(seed))
    raise ValueError(f"unknown case {name!r}")


def check(case, scratch: Optional[str] = None) -> Checked:
    """Run one case (model, source or attack) in a fresh directory under ``scratch`` and judge it."""
    from benchmarks.fuzz.attacks import AttackCase, check_attack_case
    from benchmarks.fuzz.models import Case
    from benchmarks.fuzz.oracle import check_model_case
    from benchmarks.fuzz.sources import check_source_case

    directory = tempfile.mkdtemp(prefix=f"{case.name}-", dir=scratch)
    try:
        if isinstance(case, Case):
            return check_model_case(case, directory)
        if isinstance(case, AttackCase):
            return check_attack_case(case, directory)
        return check_source_case(case, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        _forget_models()


def _forget_models() -> None:
    """Drop the model modules preclint registered (one process checks thousands of models)."""
    for name in [n for n in sys.modules if n.startswith("_preclint_model_")]:
        del sys.modules[name]


def record(name: str, case, checked: Checked, seconds: float) -> Dict[str, object]:
    verdict = checked.verdict
    entry: Dict[str, object] = {"case": name, "kind": name.rpartition("-")[0], "tags": list(case.tags),
                                "failure": verdict.failure, "seconds": round(seconds, 3)}
    if not verdict.ok:
        entry.update(detail=verdict.detail, signature=verdict.signature)
    if checked.run is not None:
        entry["rc"] = checked.run.rc
    return entry


def kept_path(kept: Path, name: str) -> Path:
    """Where a failing case is kept (pickled): ``--recheck`` on another machine checks the same bytes,
    where a case rebuilt from that machine's installed packages would differ."""
    return kept / f"{name}.pkl"


def current_path(kept: Path, pid: int) -> Path:
    """The case a worker (process ``pid``) is checking, pickled before it runs: kept by the harness
    if the worker dies or hangs on it."""
    return kept / f".current-{pid}.pkl"


def run_one(name: str, corpus_kind: str, scratch: Optional[str] = None, kept: Optional[Path] = None,
            use_kept: bool = False) -> Dict[str, object]:
    """Build (or, with ``use_kept``, load the kept copy of) case ``name``, check it and record the
    result; with ``kept``, a failing case is kept there."""
    import pickle

    start = time.perf_counter()
    if use_kept and kept is not None and kept_path(kept, name).exists():
        case = pickle.loads(kept_path(kept, name).read_bytes())
    else:
        case = build(name, corpus_kind)
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        current_path(kept, os.getpid()).write_bytes(pickle.dumps(case))
    try:
        checked = check(case, scratch)
    except Exception as exc:  # noqa: BLE001 - the harness itself failed on this case: say so, go on
        import traceback

        checked = Checked(Verdict("harness", f"{type(exc).__name__}: {exc}"[:200],
                                  f"harness: {traceback.format_exc().strip().splitlines()[-1][:120]}"))
    if kept is not None and not checked.verdict.ok:
        os.replace(current_path(kept, os.getpid()), kept_path(kept, name))
    return record(name, case, checked, time.perf_counter() - start)


def worker_main() -> None:
    """A worker of the long run: case names on stdin, one JSON record per case on the descriptor
    FUZZ_RESULT_FD (stdout belongs to the checked code). It asks to be replaced (``recycle``) after
    FUZZ_RECYCLE cases or past FUZZ_MAX_RSS_MB."""
    import json

    out = os.fdopen(int(os.environ["FUZZ_RESULT_FD"]), "w", buffering=1)
    corpus_kind = os.environ.get("FUZZ_CORPUS", "both")
    scratch = os.environ.get("FUZZ_SCRATCH")
    kept = Path(os.environ["FUZZ_KEPT"]) if os.environ.get("FUZZ_KEPT") else None
    use_kept = os.environ.get("FUZZ_USE_KEPT") == "1"
    recycle = int(os.environ.get("FUZZ_RECYCLE", "200"))
    max_rss = int(os.environ.get("FUZZ_MAX_RSS_MB", "2500"))
    done = 0
    for line in sys.stdin:
        name = line.strip()
        if not name:
            continue
        entry = run_one(name, corpus_kind, scratch, kept, use_kept)
        done += 1
        rss_mb = _rss_mb()
        entry["recycle"] = done >= recycle or rss_mb > max_rss
        out.write(json.dumps(entry) + "\n")
        if entry["recycle"]:
            break
    out.close()
    if kept is not None:
        current_path(kept, os.getpid()).unlink(missing_ok=True)


def _rss_mb() -> float:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


if __name__ == "__main__":
    worker_main()
