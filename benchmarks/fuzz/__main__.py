"""The long fuzz run: ``python -m benchmarks.fuzz --models 10000 --sources 10000`` (and ``--attacks N``,
the attack family of benchmarks.fuzz.attacks, summarised per class of attack).

Cases ``model-0`` ... ``model-{N-1}`` and ``source-0`` ... ``source-{M-1}`` are handed, one at a time,
to worker processes (``--jobs``), each of which checks many cases in process (preclint's guard and a
per-case time limit protect it) and is replaced after a few hundred cases, past a memory limit, or
when it dies: a worker that ends by a signal or passes the time limit records a crash or a hang for
the case it held, and a fresh one takes the next case. Every result is appended to a log
(``--state``/log.jsonl), so a run that stops (Ctrl-C, SIGTERM, or ``--time-budget SECONDS`` spent)
resumes where it was. Each failing case is kept, pickled, as ``STATE/cases/NAME.pkl``; ``--recheck``
runs the failing cases again (after a fix) from those kept copies, so a recheck on another machine
checks the same bytes (a source case built there from its installed packages would differ), and
records which now pass. The summary, ``--out`` (benchmarks/results/fuzz.json),
counts the inputs tried per class, the failures found per class and signature, and which are fixed.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE = ROOT / "benchmarks" / "results" / "fuzz-state"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "fuzz.json"


@dataclass
class Worker:
    proc: subprocess.Popen
    results: int  # the read end of its result pipe
    buffer: bytes = b""
    case: Optional[str] = None
    started: float = 0.0
    done: int = 0
    cpu_start: float = 0.0


@dataclass
class Harness:
    jobs: int
    corpus: str
    timeouts: Dict[str, float]
    scratch: str
    log_path: Path
    kept: Optional[Path] = None  # where failing cases are kept (pickled)
    use_kept: bool = False  # check the kept copy of a case where there is one (--recheck)
    deadline: Optional[float] = None  # time.monotonic() past which no case starts (--time-budget)
    recycle: int = 200
    max_rss_mb: int = 2500
    slack: float = 5.0  # wall time may be this many times the CPU limit
    workers: List[Worker] = field(default_factory=list)

    def start_worker(self) -> Worker:
        read, write = os.pipe()
        env = {**os.environ, "FUZZ_RESULT_FD": str(write), "FUZZ_CORPUS": self.corpus, "FUZZ_SCRATCH": self.scratch,
               "FUZZ_RECYCLE": str(self.recycle), "FUZZ_MAX_RSS_MB": str(self.max_rss_mb),
               "PRECLINT_CACHE_DIR": os.path.join(self.scratch, "cache"), "PYTHONPATH": str(ROOT),
               "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "FUZZ_KEPT": str(self.kept or ""), "FUZZ_USE_KEPT": "1" if self.use_kept else "0"}
        log = open(self.log_path.parent / "worker.log", "ab")
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.fuzz.cases"], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write,),
                                start_new_session=True)
        log.close()
        os.close(write)
        return Worker(proc, read)

    def stop(self, worker: Worker) -> Optional[int]:
        try:
            os.killpg(worker.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        code = worker.proc.wait()
        os.close(worker.results)
        if worker.proc.stdin:
            try:
                worker.proc.stdin.close()
            except OSError:
                pass
        return code

    def over_time(self, worker: Worker) -> bool:
        """Past the case's limit in CPU time (of the worker and the processes it started), or in wall
        time ``slack`` times over (a process blocked on a read uses no CPU). On a machine shared
        with other work, wall time alone calls a slow case a hang."""
        limit = self.timeouts[worker.case.rpartition("-")[0]]
        wall = time.monotonic() - worker.started
        if wall > limit * self.slack:
            return True
        return wall > limit and session_cpu(worker.proc.pid) - worker.cpu_start > limit

    def send(self, worker: Worker, name: str) -> None:
        worker.case = name
        worker.started = time.monotonic()
        worker.cpu_start = session_cpu(worker.proc.pid)
        assert worker.proc.stdin is not None
        worker.proc.stdin.write((name + "\n").encode())
        worker.proc.stdin.flush()

    def keep_case_of(self, worker: Worker, name: str) -> None:
        """Keep the case a worker died or hung on (it pickled it before checking it)."""
        if self.kept is None:
            return
        from benchmarks.fuzz.cases import current_path, kept_path

        try:
            os.replace(current_path(self.kept, worker.proc.pid), kept_path(self.kept, name))
        except OSError:  # it died before writing it: the name still rebuilds it on this machine
            pass

    def run(self, names: List[str], on_result) -> bool:
        """Check ``names``; False when the deadline stopped the run first (the cases not finished
        are not logged: a later run starts them again)."""
        pending = collections.deque(names)
        self.workers = [self.start_worker() for _ in range(min(self.jobs, len(pending)) or 0)]
        for w in self.workers:
            if pending:
                self.send(w, pending.popleft())
        while any(w.case for w in self.workers):
            busy = [w for w in self.workers if w.case]
            now = time.monotonic()
            if self.deadline is not None and now > self.deadline:
                for w in self.workers:
                    self.stop(w)
                return False
            wait = min(self.timeouts[w.case.rpartition("-")[0]] - (now - w.started) for w in busy) / self.slack
            ready, _, _ = select.select([w.results for w in busy], [], [], max(0.05, min(wait, 5.0)))
            for w in list(busy):
                replace = False
                lost = None  # the case the worker died or hung on
                if w.results in ready:
                    chunk = os.read(w.results, 1 << 16)
                    if chunk:
                        w.buffer += chunk
                        while b"\n" in w.buffer:
                            line, w.buffer = w.buffer.split(b"\n", 1)
                            entry = json.loads(line)
                            recycle = entry.pop("recycle", False)
                            on_result(entry)
                            w.case = None
                            replace = recycle
                    else:  # the worker is gone: the case it held crashed it
                        code = w.proc.wait()
                        on_result(_died(w.case, code, time.monotonic() - w.started))
                        lost, w.case = w.case, None
                        replace = True
                elif self.over_time(w):
                    limit = self.timeouts[w.case.rpartition("-")[0]]
                    on_result({"case": w.case, "kind": w.case.rpartition("-")[0], "tags": [], "failure": "hang",
                               "detail": f"no result within {limit:.0f} s of CPU time ({self.slack:.0f}x that of wall time)",
                               "signature": "hang: harness time limit", "seconds": time.monotonic() - w.started})
                    lost, w.case = w.case, None
                    replace = True
                if replace:
                    self.stop(w)
                    if lost:
                        self.keep_case_of(w, lost)
                    index = self.workers.index(w)
                    w = self.workers[index] = self.start_worker()
                if w.case is None and pending and (self.deadline is None or time.monotonic() < self.deadline):
                    self.send(w, pending.popleft())
        for w in self.workers:
            self.stop(w)
        return not pending


def session_cpu(pid: int) -> float:
    """CPU seconds used so far by process ``pid`` and its descendants (a worker and the pool it
    starts), those reaped included. Reads only their own /proc entries: a scan of all of /proc for
    each case and each wait cost the harness more than the cases on a busy host."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    stack, seen = [pid], set()
    while stack:
        process = stack.pop()
        if process in seen:
            continue
        seen.add(process)
        try:
            with open(f"/proc/{process}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()  # after the name: state, ppid, pgrp, ...
            tasks = os.listdir(f"/proc/{process}/task")
        except OSError:  # gone meanwhile
            continue
        total += sum(int(v) for v in fields[11:15])  # utime, stime, and of its reaped children cutime, cstime
        for task in tasks:
            try:
                with open(f"/proc/{process}/task/{task}/children") as f:
                    stack.extend(int(child) for child in f.read().split())
            except OSError:
                continue
    return total / tick


def _died(name: str, code: int, seconds: float) -> Dict[str, object]:
    how = f"signal {signal.Signals(-code).name}" if code < 0 and -code in signal.valid_signals() else f"exit {code}"
    return {"case": name, "kind": name.rpartition("-")[0], "tags": [], "failure": "crash",
            "detail": f"the process checking it ended by {how}", "signature": f"crash: {how}", "seconds": seconds}


# ------------------------------------------------------------------------------------ the log

def read_log(path: Path) -> List[Dict[str, object]]:
    if not path.exists():
        return []
    entries = []
    with open(path) as f:
        for line in f:
            try:
                entries.append(json.loads(line))
            except ValueError:  # a line cut by a stop mid-write
                continue
    return entries


def latest(entries: List[Dict[str, object]]) -> Dict[str, Dict[str, object]]:
    """The last result of each case, with the failures it had before (``was``) kept."""
    state: Dict[str, Dict[str, object]] = {}
    for e in entries:
        name = str(e["case"])
        before = state.get(name)
        was = list(before.get("was", [])) if before else []
        if before and before.get("failure"):
            was.append({k: before[k] for k in ("failure", "detail", "signature") if k in before})
        if before and not e.get("tags"):
            e = {**e, "tags": before.get("tags", [])}
        state[name] = {**e, "was": was}
    return state


def summarize(entries: List[Dict[str, object]], meta: Dict[str, object]) -> Dict[str, object]:
    from benchmarks.fuzz.attacks import attack_summary

    state = latest(entries)
    inputs: Dict[str, collections.Counter] = {"model": collections.Counter(), "source": collections.Counter()}
    tried = collections.Counter()
    for e in state.values():
        kind = str(e["kind"])
        tried[kind] += 1
        for tag in e.get("tags", []):
            inputs.setdefault(kind, collections.Counter())[tag] += 1
    signatures: Dict[str, Dict[str, object]] = {}
    for e in state.values():
        failures = list(e.get("was", [])) + ([{k: e[k] for k in ("failure", "detail", "signature")}] if e.get("failure") else [])
        for f in failures:
            sig = str(f["signature"])
            s = signatures.setdefault(sig, {"class": f["failure"], "signature": sig, "detail": f["detail"], "cases": 0,
                                            "still_failing": 0, "example": e["case"], "kind": e["kind"]})
            s["cases"] = int(s["cases"]) + 1
        if e.get("failure"):
            signatures[str(e["signature"])]["still_failing"] = int(signatures[str(e["signature"])]["still_failing"]) + 1
    by_class: Dict[str, Dict[str, int]] = {}
    for s in signatures.values():
        c = by_class.setdefault(f"{s['kind']}:{s['class']}", {"signatures": 0, "cases": 0, "fixed_signatures": 0, "open_cases": 0})
        c["signatures"] += 1
        c["cases"] += int(s["cases"])
        c["open_cases"] += int(s["still_failing"])
        if not s["still_failing"]:
            c["fixed_signatures"] += 1
    return {
        **meta,
        "tried": dict(tried),
        "inputs": {k: dict(sorted((t, n) for t, n in v.items() if n)) for k, v in inputs.items()},
        "failures_by_class": dict(sorted(by_class.items())),
        "failures": sorted(signatures.values(), key=lambda s: (-int(s["still_failing"]), str(s["class"]), -int(s["cases"]))),
        "open": sum(int(s["still_failing"]) for s in signatures.values()),
        **({"attacks": attack_summary(list(state.values()))} if tried.get("attack") else {}),
    }


# ------------------------------------------------------------------------------------ main

def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.fuzz", description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=0, help="model cases model-0 .. model-(N-1)")
    parser.add_argument("--sources", type=int, default=0, help="source cases source-0 .. source-(N-1)")
    parser.add_argument("--attacks", type=int, default=0, help="attack cases attack-0 .. attack-(N-1)")
    parser.add_argument("--first", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--attack-classes", metavar="CLASS,...",
                        help="of the attack seeds, only those that draw one of these classes (the seeds keep their cases)")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes (default 1)")
    parser.add_argument("--corpus", choices=("own", "installed", "both"), default="both",
                        help="the files source cases start from (default both)")
    parser.add_argument("--state", type=Path, default=DEFAULT_STATE, help="where the log of results is kept")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the summary (JSON)")
    parser.add_argument("--model-timeout", type=float, default=300.0, help="CPU seconds for one model case")
    parser.add_argument("--source-timeout", type=float, default=120.0, help="CPU seconds for one source case")
    parser.add_argument("--attack-timeout", type=float, default=300.0, help="CPU seconds for one attack case")
    parser.add_argument("--recheck", action="store_true",
                        help="run the cases that failed again (the kept copies under STATE/cases where there are)")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="start no case after this many seconds; the cases then running are stopped and "
                             "not logged (a later run resumes with them)")
    parser.add_argument("--summary-only", action="store_true", help="write the summary from the log and stop")
    parser.add_argument("--slack", type=float, default=5.0,
                        help="a case is a hang past its time limit in CPU time, or this many times it in wall time")
    parser.add_argument("--recycle", type=int, default=200, help="cases a worker checks before it is replaced")
    parser.add_argument("--note", action="append", default=[], help="a line the summary keeps (what a figure means)")
    parser.add_argument("--minimize", metavar="CASE", help="shrink one failing case (model-N, source-N) to a reproducer")
    args = parser.parse_args(argv)
    if args.minimize:
        return minimize(args.minimize, args.corpus, args.state / "minimized" / args.minimize,
                        args.model_timeout if args.minimize.startswith("model") else args.source_timeout)

    args.state.mkdir(parents=True, exist_ok=True)
    log_path = args.state / f"log-{args.corpus}.jsonl"
    entries = read_log(log_path)
    state = latest(entries)
    if args.recheck:
        names = sorted(n for n, e in state.items() if e.get("failure"))
    else:
        wanted = [f"model-{i}" for i in range(args.first, args.first + args.models)]
        wanted_sources = [f"source-{i}" for i in range(args.first, args.first + args.sources)]
        # interleaved, so that both kinds progress together
        names = [n for pair in _zip_longest(wanted, wanted_sources) for n in pair if n and n not in state]
        attacks = [f"attack-{i}" for i in range(args.first, args.first + args.attacks)]
        if args.attack_classes:
            from benchmarks.fuzz.attacks import attack_case

            classes = {c.strip() for c in args.attack_classes.split(",") if c.strip()}
            attacks = [n for n in attacks if attack_case(int(n.split("-")[1])).attack in classes]
        names += [n for n in attacks if n not in state]
    from benchmarks.provenance import run_provenance

    meta = {"provenance": run_provenance(),
            "command": "python -m benchmarks.fuzz " + " ".join(argv if argv is not None else sys.argv[1:]),
            "corpus": args.corpus, **({"notes": args.note} if args.note else {})}
    if args.summary_only or not names:
        _write_summary(args.out, entries, meta)
        return 0
    print(f"{len(names)} cases to run ({len(state)} in the log)", flush=True)
    scratch = tempfile.mkdtemp(prefix="preclint-fuzz-")
    harness = Harness(jobs=args.jobs, corpus=args.corpus, scratch=scratch, log_path=log_path, recycle=args.recycle,
                      slack=args.slack, kept=args.state / "cases", use_kept=args.recheck,
                      deadline=None if args.time_budget is None else time.monotonic() + args.time_budget,
                      timeouts={"model": args.model_timeout, "source": args.source_timeout,
                                "attack": args.attack_timeout})
    counts = collections.Counter()
    start = time.monotonic()
    # a run in the background (nohup, &) ignores SIGINT: SIGTERM stops it as cleanly
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with open(log_path, "a") as log:
        def on_result(entry):
            if args.recheck:
                entry["recheck"] = True
            log.write(json.dumps(entry) + "\n")
            log.flush()
            counts[(entry["kind"], entry.get("failure"))] += 1
            done = sum(counts.values())
            if entry.get("failure"):
                print(f"{entry['case']}: {entry['failure']}: {str(entry.get('detail'))[:200]}", flush=True)
            if done % 100 == 0:
                rate = done / (time.monotonic() - start)
                print(f"[{done}/{len(names)} {rate:.2f}/s] " + ", ".join(f"{k}:{f or 'ok'}={n}" for (k, f), n in sorted(counts.items(), key=str)), flush=True)
                _write_summary(args.out, read_log(log_path), meta)

        try:
            if not harness.run(names, on_result):
                print(f"time budget of {args.time_budget:g} s spent; run again to resume", flush=True)
        except KeyboardInterrupt:
            for w in harness.workers:
                harness.stop(w)
            print("stopped; run again to resume", flush=True)
    for current in (args.state / "cases").glob(".current-*.pkl"):  # cases of workers stopped midway
        current.unlink(missing_ok=True)
    _write_summary(args.out, read_log(log_path), meta)
    import shutil

    shutil.rmtree(scratch, ignore_errors=True)
    return 0


def minimize(name: str, corpus: str, out: Path, timeout: float) -> int:
    """Shrink case ``name`` and write the reproducer (its files and command line) under ``out``."""
    import torch

    from benchmarks.fuzz import cases
    from benchmarks.fuzz.minimize import shrink_case, signature_in_fork

    torch.set_num_threads(1)  # the candidates run in forked children
    small = shrink_case(cases.build(name, corpus), timeout)
    if small is None:
        print(f"{name} passes: nothing to shrink")
        return 1
    out.mkdir(parents=True, exist_ok=True)
    files = dict(getattr(small, "files", {})) or {"proj/target.py": small.data, **small.extra}
    for rel, content in {**files, **getattr(small, "binary", {})}.items():
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", "surrogateescape"))
    argv = small.argv or ["check", "--source-only", "proj/target.py"]  # an api case: check_file on the file
    (out / "command.txt").write_text("preclint " + " ".join(argv) + "\n" + signature_in_fork(small, timeout) + "\n")
    print(f"{name}: reproducer in {out} ({sum(len(v) for v in files.values())} bytes): preclint {' '.join(argv)}")
    return 0


def _zip_longest(a: List[str], b: List[str]):
    import itertools

    return itertools.zip_longest(a, b)


def _write_summary(path: Path, entries, meta) -> None:
    summary = summarize(entries, meta)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=1) + "\n")
    os.replace(tmp, path)


if __name__ == "__main__":
    raise SystemExit(main())
