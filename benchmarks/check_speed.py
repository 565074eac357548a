"""Benchmark: `preclint check` on torchvision resnet50 against the bare cost of its work.

The baseline is what any tool must do to look at the model: import torch and torchvision, build
the model, one FX symbolic trace, one fp32 forward pass (1x3x224x224). Both run as fresh
processes, alternately, several times; the script prints the median wall time and peak RSS of
each and their ratios, measured in this one run. ``--before DIR`` also runs preclint from another
checkout (a ``git archive`` of an earlier commit) in each round, so that a change's effect on the
check is measured in the same run as the ratio, beside the same bare runs.

    python benchmarks/check_speed.py [--repeats 3] [--threads 1] [--before DIR] [--out FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import stamp  # noqa: E402

BASELINE = """
import torch, torchvision, torch.fx
torch.manual_seed(0)
model = torchvision.models.resnet50().eval()
torch.fx.symbolic_trace(model)
with torch.no_grad():
    model(torch.rand(1, 3, 224, 224))
"""

PRECLINT = [sys.executable, "-m", "preclint", "check", "torchvision.models:resnet50", "--input-shape", "1,3,224,224",
            "--output-format", "json", "--exit-zero"]


def measure(argv, env=None, cwd=None) -> tuple:
    """Wall seconds and peak RSS (MiB) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=cwd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {stderr.strip()}")
    return wall, usage.ru_maxrss / 1024.0  # ru_maxrss is KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", help="also write the result (JSON) here")
    parser.add_argument("--threads", type=int, help="torch's threads in both (OMP_NUM_THREADS); on a machine "
                        "others load, one thread each measures the work where two wait on each other")
    parser.add_argument("--before", metavar="DIR", help="also time preclint from this checkout, in each round "
                        "(preclint_before; its ratio to the bare work and this checkout's to it)")
    args = parser.parse_args()
    env = None
    if args.threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    runs = {"baseline": [], "preclint": []}
    before_env = None
    if args.before:
        runs["preclint_before"] = []
        before_env = {**(env or os.environ), "PYTHONPATH": os.path.abspath(args.before)}
    load_before = os.getloadavg()  # others' work on the machine: a loaded machine stretches both
    measure([sys.executable, "-c", BASELINE], env)  # warm the page cache for both
    for round_ in range(args.repeats):
        runs["baseline"].append(measure([sys.executable, "-c", BASELINE], env))
        if before_env is None:
            runs["preclint"].append(measure(PRECLINT, env))
            continue
        # the two checkouts in turn first: neither always runs right after the bare work
        for name in (("preclint", "preclint_before") if round_ % 2 == 0 else ("preclint_before", "preclint")):
            # (run from the other checkout: `python -m` puts the working directory first on sys.path)
            runs[name].append(measure(PRECLINT, env) if name == "preclint" else
                              measure(PRECLINT, before_env, cwd=os.path.abspath(args.before)))
    result = {}
    for name, values in runs.items():
        result[name] = {"wall_s": statistics.median(v[0] for v in values),
                        "peak_rss_mib": statistics.median(v[1] for v in values)}
    result["ratio"] = {
        "wall": result["preclint"]["wall_s"] / result["baseline"]["wall_s"],
        "peak_rss": result["preclint"]["peak_rss_mib"] / result["baseline"]["peak_rss_mib"],
    }
    if args.before:
        result["ratio"]["wall_before"] = result["preclint_before"]["wall_s"] / result["baseline"]["wall_s"]
        result["ratio"]["peak_rss_before"] = result["preclint_before"]["peak_rss_mib"] / result["baseline"]["peak_rss_mib"]
        result["ratio"]["wall_to_before"] = result["preclint"]["wall_s"] / result["preclint_before"]["wall_s"]
        result["before"] = os.path.abspath(args.before)
    result["threads"] = args.threads or "torch's default"
    result["load_average"] = {"before": [round(v, 2) for v in load_before],
                              "after": [round(v, 2) for v in os.getloadavg()]}
    result["runs"] = {name: [{"wall_s": round(w, 3), "peak_rss_mib": round(r, 1)} for w, r in values]
                      for name, values in runs.items()}
    result["machine"] = f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    import torch  # noqa: E402 - only for the versions line

    result["torch"] = torch.__version__
    result = stamp(result)
    print(json.dumps(result, indent=2))
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(result, handle, indent=2)
            handle.write("\n")


if __name__ == "__main__":
    main()
