"""Benchmark: capture's recorder of another checkout against this one, in one process, interleaved.

    python benchmarks/recorder_ab.py --before /path/to/old/preclint/capture/recorder.py --size narrow --out FILE

On a shared machine a wall-clock figure moves by 2-3x from one run to the next, more than a change
of the recorder does; so both recorders are loaded into one process and run turn about, and each
figure is the least CPU time (``time.process_time``, one torch thread) of ``--repeat`` turns. Both
run on the same model (benchmarks/large_models.py's Llama shapes) and the same preclint otherwise:
the older ``recorder.py`` is loaded beside this checkout's and takes its place in capture and in the
probe's passes for its turns. Per turn: the bare forward; each recorder with an observer that does
nothing (``locate=False`` as the probe's passes, and located as the check's capture); the floor of a
replay of one recording (eager_pass_cost.py's ``tape_replay``); the check and the probe as
large_models.py runs them. Ratios: the probe's (and check's) CPU time over the bare forward's.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from contextlib import contextmanager
from typing import Callable, Dict

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.eager_pass_cost import tape_of  # noqa: E402
from benchmarks.large_models import MODES, build, probe  # noqa: E402
from benchmarks.provenance import stamp, write_stamped  # noqa: E402
from preclint.capture import graph as capture_graph  # noqa: E402
from preclint.capture import recorder as this_recorder  # noqa: E402
from preclint.capture.observer import Observer  # noqa: E402
from preclint.measure import program as measure_program  # noqa: E402


def load_recorder(path: str):
    spec = importlib.util.spec_from_file_location("preclint_recorder_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@contextmanager
def recording_with(recorder):
    """Capture (the check) and the probe's passes record with ``recorder``'s capture_function_mode."""
    saved = capture_graph.capture_function_mode, measure_program.capture_function_mode
    capture_graph.capture_function_mode = measure_program.capture_function_mode = recorder.capture_function_mode
    try:
        yield
    finally:
        capture_graph.capture_function_mode, measure_program.capture_function_mode = saved


def cpu_seconds(run: Callable[[], object]) -> float:
    start = time.process_time()
    run()
    return time.process_time() - start


def measure(before_path: str, size: str, repeat: int) -> Dict[str, object]:
    before = load_recorder(before_path)
    device = torch.device("cpu")
    model, ids = build(size, device)
    with torch.no_grad():
        model(ids)
        nodes = this_recorder.capture_function_mode(model, (ids,), Observer(), locate=False)[0]
        older = before.capture_function_mode(model, (ids,), Observer(), locate=False)[0]
        same_nodes = [(n.name, n.kind, n.target, n.module_path, n.inputs) for n in nodes] == [
            (n.name, n.kind, n.target, n.module_path, n.inputs) for n in older]
        replay = tape_of(model, ids)
    ops = len(nodes)
    turns = {
        "forward": lambda: model(ids),
        "tape_replay": replay,
    }
    for label, rec in (("before", before), ("after", this_recorder)):
        turns[f"recorder_{label}"] = lambda rec=rec: rec.capture_function_mode(model, (ids,), Observer(), locate=False)
        turns[f"recorder_located_{label}"] = lambda rec=rec: rec.capture_function_mode(model, (ids,), Observer())
    least: Dict[str, float] = {}
    with torch.no_grad():
        for _ in range(repeat):
            for label, run in turns.items():
                least[label] = min(least.get(label, float("inf")), cpu_seconds(run))
    for label, rec in (("before", before), ("after", this_recorder)):  # each probe loads what it needs once
        with recording_with(rec):
            probe(model, ids, device, MODES, False)
    probes: Dict[str, Dict[str, float]] = {}
    for _ in range(max(2, repeat // 3)):
        for label, rec in (("before", before), ("after", this_recorder)):
            with recording_with(rec):
                start = time.process_time()
                _report, _result, check_s, probe_s = probe(model, ids, device, MODES, False)
                total = time.process_time() - start
            best = probes.setdefault(label, {"cpu_s": float("inf")})
            if total < best["cpu_s"]:
                best.update(cpu_s=total, wall_check_s=check_s, wall_probe_s=probe_s)
    forward = least["forward"]
    return {
        "size": size, "ops": ops, "repeat": repeat, "same_nodes": same_nodes,
        "cpu_seconds": least, "per_op_us": {k: 1e6 * v / ops for k, v in least.items()},
        "recorder_own_per_op_us": {label: 1e6 * (least[f"recorder_{label}"] - forward) / ops for label in ("before", "after")},
        "probes": probes,
        "check_and_probe_over_forward": {label: p["cpu_s"] / forward for label, p in probes.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="recorder.py of the checkout to compare against")
    parser.add_argument("--size", default="narrow")
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    result = stamp(measure(args.before, args.size, args.repeat))
    write_stamped(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
