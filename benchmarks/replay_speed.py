"""Benchmark: the probe with its passes replayed from the recorded ops against the model's own Python.

    python benchmarks/replay_speed.py --size tiny --device cpu --threads 1 --out benchmarks/results  # replay_tiny_cpu.json
    python benchmarks/replay_speed.py --size narrow --device cpu --threads 1 --out benchmarks/results
    python benchmarks/replay_speed.py --size 1b --device cuda --out $OUT                     # replay_1b_cuda.json
    python benchmarks/replay_speed.py --size 7b --device cuda --out $OUT

A Llama-shaped model (benchmarks/large_models.py builds it; torch.fx cannot trace it, so every pass
of the probe ran its Python under the function-mode recorder) is probed in one process with replays
off (``Program.replays = False``: every pass runs the model, as before measure/replay.py) and on,
alternately, ``--repeat`` times each; the figures are each setting's least run after its first (by
check + probe; on a machine shared with other work the least is the one least disturbed), every run
kept (``runs``). Besides: one pass on its own (the float32 copy, nothing observed, no autograd; the least of
``--passes`` runs): the model's forward, the eager recorded pass, the replayed pass. Recorded: the
check's and the probe's seconds and stages per setting, the probe over the bare work (as
large_models.py times it: build, a float64 forward, one forward per mode), how many passes were
replayed, the least CPU seconds of the process over check and probe (``least_cpu_s``: what the
Python costs, whatever else the machine runs), and whether the two settings' ledgers agree to the printed three digits, row by row.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Dict

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.large_models import MODES, SIZES, bare_work, build, digest, probe, release, sync  # noqa: E402
from benchmarks.provenance import stamp  # noqa: E402
from preclint.capture.observer import Observer  # noqa: E402
from preclint.core.ir import Graph  # noqa: E402
from preclint.measure.program import Program  # noqa: E402
from preclint.measure.replay import Recording  # noqa: E402


def one_pass(model, ids, device, passes: int) -> Dict[str, float]:
    """The least seconds of ``passes`` runs each: the forward, a recorded eager pass, a replayed pass."""
    def least(fn) -> float:
        best = float("inf")
        for _ in range(passes):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            best = min(best, time.perf_counter() - start)
        return best

    with torch.no_grad():
        replaying = Program(Graph([], "llama", "function-mode"), model)
        for _ in range(2):  # the recording and the run that confirms it
            replaying.run(model, (ids,), Observer())
        return {"forward_s": least(lambda: model(ids)),
                "eager_pass_s": least(lambda: Program(Graph([], "llama", "function-mode"), model).run(
                    model, (ids,), Observer())),
                "replayed_pass_s": least(lambda: replaying.run(model, (ids,), Observer())),
                "nodes": len(replaying.recorded or ())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--precision", default=",".join(MODES))
    parser.add_argument("--repeat", type=int, default=3, help="probe runs per setting (the first of each is not counted)")
    parser.add_argument("--passes", type=int, default=5, help="runs of each single pass (the least is kept)")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: its own number); 1 on a "
                        "machine shared with other work, where a second thread waits for a busy core")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/replay_speed"))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{torch.cuda.current_device()}")
    modes = tuple(args.precision.split(","))
    import transformers.models.llama.modeling_llama  # noqa: F401  (imported before the clock starts)

    sync(device)
    start = time.perf_counter()
    model, ids = build(args.size, device)
    sync(device)
    build_s = time.perf_counter() - start

    replayed = []
    replay_run = Recording.run
    Recording.run = lambda self, *a: replayed.append(1) or replay_run(self, *a)
    runs: Dict[str, list] = {"run": [], "replayed": []}
    ledgers: Dict[str, Any] = {}
    notes: Dict[str, list] = {}
    for index in range(2 * max(2, args.repeat)):
        setting = ("run", "replayed")[index % 2]
        Program.replays = setting == "replayed"
        replayed.clear()
        release(device)
        cpu = time.process_time()
        _, result, check_s, probe_s = probe(model, ids, device, modes, False)
        runs[setting].append({"check_s": check_s, "probe_s": probe_s, "cpu_s": time.process_time() - cpu,
                              "stages_s": result.timings,
                              "passes_replayed": len(replayed)})
        ledgers[setting] = digest(result)
        notes[setting] = list(result.notes)
        del result
    Program.replays = True
    Recording.run = replay_run
    release(device)
    bare_runs = [bare_work(model, ids, device, modes) for _ in range(2)]
    bare_s = build_s + min(sum(b.values()) for b in bare_runs)
    single = one_pass(model, ids, device, args.passes)

    figures: Dict[str, Any] = {"size": args.size, "tokens": ids.shape[1], "modes": list(modes),
                               "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                               "torch": torch.__version__, "threads": torch.get_num_threads(), "build_s": build_s, "bare_s": bare_s, "one_pass": single}
    for setting, rows in runs.items():
        least = min(rows[1:], key=lambda r: r["check_s"] + r["probe_s"])
        check_s, probe_s, stages = least["check_s"], least["probe_s"], least["stages_s"]
        figures[setting] = {"check_s": check_s, "probe_s": probe_s, "over_bare": (build_s + check_s + probe_s) / bare_s,
                            "least_cpu_s": min(r["cpu_s"] for r in rows[1:]),
                            "passes_replayed": least["passes_replayed"], "stages_s": stages,
                            "runs": [{k: v for k, v in r.items() if k != "stages_s"} for r in rows],
                            "notes": notes[setting]}
    a, b = ledgers["run"], ledgers["replayed"]
    rows = [(mode, name) for mode in a for name in a[mode]]
    figures["ledger_rows"] = len(rows)
    figures["ledger_rows_agreeing"] = sum(b.get(mode, {}).get(name) == a[mode][name] for mode, name in rows)
    figures["probe_speedup"] = figures["run"]["probe_s"] / figures["replayed"]["probe_s"]
    figures["cpu_speedup"] = figures["run"]["least_cpu_s"] / figures["replayed"]["least_cpu_s"]
    figures["ledger"] = b
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, f"replay_{args.size}_{device.type}.json")
    with open(path, "w") as f:
        json.dump(stamp(figures), f, indent=1)
    shown = {k: v for k, v in figures.items() if k != "ledger"}
    for setting in runs:
        shown[setting] = {k: v for k, v in shown[setting].items() if k not in ("stages_s", "runs")}
    print(json.dumps(shown, indent=1))
    return 0 if figures["ledger_rows_agreeing"] == figures["ledger_rows"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
