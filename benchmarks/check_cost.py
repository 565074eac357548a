"""The cost of `preclint check` on models whose check was slow or large, this checkout against another
(``--before DIR``, a `git archive` of the commit to compare with), runs alternated so that both sides
meet the same load: the default-built Faster R-CNN on one 320 px image (it resizes it to 800 px
inside), and a small MLP as users hand it over compiled (the whole model, two of its layers, a
function its forward calls) beside its uncompiled twin.

    python benchmarks/check_cost.py --models detector --before /tmp/before --out benchmarks/results/check_cost_cpu.json
    python benchmarks/check_cost.py --models compiled,compiled_layers,compiled_function,eager_twin --repeats 3 ...

Each check runs in a subprocess of its own under ``/usr/bin/time -v`` (``--threads`` threads): wall
seconds, CPU seconds (user + system: steadier than wall on a shared machine), peak RSS, and the digest
of the JSON report without its timing (the same findings and figures on both sides, or not).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import ROOT, stamp  # noqa: E402

_MLP = "nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()"
MODELS: Dict[str, str] = {
    "detector": """\
import torch
import torchvision
torch.manual_seed(0)
model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None).eval()
example_inputs = ([torch.rand(3, 320, 320)],)
""",
    "eager_twin": f"""\
import torch
from torch import nn
torch.manual_seed(0)
model = {_MLP}
example_inputs = (torch.randn(8, 64),)
""",
    "compiled": f"""\
import torch
from torch import nn
torch.manual_seed(0)
model = torch.compile({_MLP})
example_inputs = (torch.randn(8, 64),)
""",
    "compiled_layers": f"""\
import torch
from torch import nn
torch.manual_seed(0)
model = {_MLP}
model[0] = torch.compile(model[0])
model[2] = torch.compile(model[2])
example_inputs = (torch.randn(8, 64),)
""",
    "compiled_function": """\
import torch
from torch import nn
import torch.nn.functional as F
torch.manual_seed(0)


@torch.compile
def mlp(x, first, second):
    return F.linear(F.gelu(F.linear(x, first.weight, first.bias)), second.weight, second.bias)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(64, 128)
        self.second = nn.Linear(128, 32)

    def forward(self, x):
        return mlp(x, self.first, self.second)


model = Model().eval()
example_inputs = (torch.randn(8, 64),)
""",
}


def digest(report: Dict) -> str:
    """The report without its timing and the model file's path: what the check found and predicted."""
    kept = {k: v for k, v in report.items() if k not in ("timing", "model")}
    return hashlib.sha256(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def check_once(path: str, root: str, threads: int) -> Dict:
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "preclint", "check", path, "--isolated", "--output-format",
           "json", "--exit-zero", "--quiet", "--timeout", "0"]
    env = dict(os.environ, PYTHONPATH=root, OMP_NUM_THREADS=str(threads))
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=os.path.dirname(path))

    def field(pattern: str) -> Optional[str]:
        found = re.search(pattern, done.stderr)
        return found.group(1) if found else None

    wall = field(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)")
    entry: Dict = {"exit": done.returncode,
                   "wall_s": round(sum(float(p) * 60 ** i for i, p in enumerate(reversed(wall.split(":")))), 2)
                   if wall else None,
                   "cpu_s": round(float(field(r"User time \(seconds\): (\S+)") or "nan")
                                  + float(field(r"System time \(seconds\): (\S+)") or "nan"), 2),
                   "max_rss_mib": round(int(field(r"Maximum resident set size \(kbytes\): (\d+)") or 0) / 1024, 1),
                   "load_average_1min": round(os.getloadavg()[0], 2)}
    try:
        entry["digest"] = digest(json.loads(done.stdout))
    except json.JSONDecodeError:
        entry["error"] = done.stderr.strip().splitlines()[-1:] or ["?"]
    return entry


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--before", help="the root of another checkout, checked alternately with this one")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    sides = {"after": str(ROOT)} if not args.before else {"before": os.path.abspath(args.before), "after": str(ROOT)}
    result: Dict = {"threads": args.threads, "sides": sorted(sides), "models": {}}
    with tempfile.TemporaryDirectory() as directory:
        for name in args.models.split(","):
            path = os.path.join(directory, f"{name}.py")
            with open(path, "w") as f:
                f.write(MODELS[name])
            runs: Dict[str, List[Dict]] = {side: [] for side in sides}
            for _ in range(args.repeats):
                for side, root in sides.items():  # alternated: both sides meet the same load
                    runs[side].append(check_once(path, root, args.threads))
                    print(name, side, json.dumps(runs[side][-1]), flush=True)
            result["models"][name] = {side: {"runs": entries,
                                             "best_cpu_s": min(e["cpu_s"] for e in entries),
                                             "best_wall_s": min(e["wall_s"] or float("inf") for e in entries),
                                             "max_rss_mib": max(e["max_rss_mib"] for e in entries)}
                                      for side, entries in runs.items()}
    with open(args.out, "w") as f:
        json.dump(stamp(result), f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
