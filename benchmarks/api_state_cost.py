"""Benchmark: what giving back the process state costs a preclint.check call.

    python benchmarks/api_state_cost.py --repeat 15 --out FILE

``preclint.check`` saves every setting of preclint.capture.global_state before the walk and writes
it back after (docs/api.md, "Global state"). Measured here, in one process:

* ``preserved_us``: one ``with preserved(): pass`` (save, then write back with nothing changed), the
  median of 200, with torch's compiler config modules (torch._dynamo.config, torch._inductor.config)
  not loaded and then loaded (their settings are copied on each save);
* ``check_s``: the median of ``--repeat`` calls of preclint.check on a tiny model (a Linear, 8 -> 4;
  tf32), with ``preserved`` as it is and with it replaced by a context that does nothing, in
  alternating rounds; ``added_s`` is their difference.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

import torch
from torch import nn

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import preclint  # noqa: E402
from benchmarks.provenance import stamp, write_stamped  # noqa: E402
from preclint.capture import global_state  # noqa: E402


def preserved_us(times: int = 200) -> float:
    runs = []
    for _ in range(times):
        start = time.perf_counter()
        with global_state.preserved():
            pass
        runs.append(time.perf_counter() - start)
    return 1e6 * statistics.median(runs)


def check_s(repeat: int) -> dict:
    model, x = nn.Linear(8, 4), torch.randn(2, 8)
    preclint.check(model, x, precisions=("tf32",))  # imports and caches warm
    real = global_state.preserved
    timed = {"restoring": [], "not restoring": []}
    for _ in range(repeat):
        for name, context in (("restoring", real), ("not restoring", contextlib.nullcontext)):
            global_state.preserved = context
            try:
                start = time.perf_counter()
                preclint.check(model, x, precisions=("tf32",))
                timed[name].append(time.perf_counter() - start)
            finally:
                global_state.preserved = real
    return {name: statistics.median(runs) for name, runs in timed.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--out")
    args = parser.parse_args()
    without_compiler = preserved_us()
    import torch._dynamo.config  # noqa: F401
    import torch._inductor.config  # noqa: F401

    with_compiler = preserved_us()
    checks = check_s(args.repeat)
    result = stamp({
        "preserved_us": {"compiler configs not loaded": round(without_compiler, 1),
                         "compiler configs loaded": round(with_compiler, 1)},
        "settings": len(global_state.settings()),
        "check_s": {name: round(value, 4) for name, value in checks.items()},
        "added_s": round(checks["restoring"] - checks["not restoring"], 4),
        "repeat": args.repeat,
    })
    write_stamped(result, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
