"""Whether two checkouts of preclint say the same thing: findings, numbers and notes, model by model.

A reorganisation must not change what a user reads. This runs ``preclint check --output-format json``
(and ``--probe cpu``) from each checkout on the same models, in the same process environment, and
reduces each report to what a user sees: every finding's code, severity, place, message, fix and
precisions, the predicted output error per precision, the top layers and the notes. Numbers are
compared as printed (three significant digits); the report's environment block (versions, thread
count) is left out, since both runs share it.

    python -m benchmarks.same_behaviour --tree /path/to/old/checkout --tree . \\
        --out benchmarks/results/same_behaviour.json

The digest of each (model, probe or not) is a hash of that reduced report; a difference names the
model and the first fields that differ.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List

from benchmarks.provenance import stamp

ROOT = Path(__file__).resolve().parent.parent
# the bundled example, the test suite's model files a user could have written, and torchvision's
# architectures named as a user names them
MODELS = [
    ["examples/mixed_precision_pitfalls.py"],
    ["tests/models/blocks_and_net.py"],
    ["tests/models/detector_like.py"],
    ["tests/models/sibling_layers.py"],
    ["tests/models/plan_culprits.py"],
    ["tests/models/lightning_style.py"],
    ["torchvision.models:resnet18", "--input-shape", "1,3,64,64"],
    ["torchvision.models:mobilenet_v3_small", "--input-shape", "1,3,64,64"],
    ["torchvision.models:vit_b_16", "--input-shape", "1,3,224,224"],
]
# printed precision: what the console and the messages show
_NUMBER = re.compile(r"-?\d+\.\d+(?:e[+-]?\d+)?|\d+e[+-]?\d+")


def _printed(value: Any) -> Any:
    if isinstance(value, float):
        return float(f"{value:.3g}")
    if isinstance(value, dict):
        return {k: _printed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printed(v) for v in value]
    if isinstance(value, str):
        return _NUMBER.sub(lambda m: f"{float(m.group(0)):.3g}", value)
    return value


def reduced(report: Dict[str, Any]) -> Dict[str, Any]:
    """What a user reads of a json report, numbers as printed."""
    notes = [n for n in report.get("notes", []) if not n.startswith("probe: emulated on")
             and not n.startswith("probe: measured on")]
    return _printed({"capture": report.get("capture"), "precisions": report.get("precisions"),
                     "findings": report.get("findings", []), "summary": report.get("summary", {}), "notes": notes})


def run(tree: Path, model: List[str], probe: bool, timeout: float) -> Dict[str, Any]:
    # -P: the checkout on PYTHONPATH is the preclint that runs, not the one in the working directory
    command = [sys.executable, "-P", "-m", "preclint", "check", *model, "--output-format", "json", "--no-cache"]
    if probe:
        command += ["--probe", "cpu"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if not done.stdout.strip().startswith("{"):
        return {"exit": done.returncode, "error": (done.stderr.strip().splitlines() or ["(no output)"])[-1]}
    return {"exit": done.returncode, "report": reduced(json.loads(done.stdout))}


def first_differences(a: Any, b: Any, path: str = "", limit: int = 5) -> List[str]:
    if type(a) is not type(b):
        return [f"{path or '.'}: {a!r} != {b!r}"]
    if isinstance(a, dict):
        out: List[str] = []
        for key in sorted(set(a) | set(b)):
            out += first_differences(a.get(key), b.get(key), f"{path}.{key}", limit)
            if len(out) >= limit:
                break
        return out[:limit]
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items != {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += first_differences(x, y, f"{path}[{i}]", limit)
            if len(out) >= limit:
                break
        return out[:limit]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def digest(result: Dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()[:16]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.same_behaviour", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", action="append", required=True, help="a checkout of preclint (twice: before, after)")
    parser.add_argument("--models", nargs="*", help="model arguments, each as one string (default: the built-in list)")
    parser.add_argument("--no-probe", action="store_true", help="compare the check only")
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    trees = [Path(t).resolve() for t in args.tree]
    models = [m.split() for m in args.models] if args.models else MODELS
    rows = []
    for model in models:
        for probe in ((False,) if args.no_probe else (False, True)):
            runs = [run(tree, model, probe, args.timeout) for tree in trees]
            row = {"model": " ".join(model), "probe": probe, "digests": [digest(r) for r in runs],
                   "exits": [r["exit"] for r in runs], "findings": [len(r.get("report", {}).get("findings", [])) for r in runs]}
            row["same"] = len(set(row["digests"])) == 1
            if not row["same"]:
                row["differences"] = first_differences(runs[0], runs[-1])
            rows.append(row)
            print(f"{row['model']:<55} probe={probe!s:<5} {'same' if row['same'] else 'DIFFERENT'} "
                  f"findings={row['findings']} exits={row['exits']}", flush=True)
    result = stamp({"trees": [str(t) for t in trees], "models": rows,
                    "same": sum(r["same"] for r in rows), "compared": len(rows)})
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['same']} of {result['compared']} reports the same")
    return 0 if result["same"] == result["compared"] else 1


if __name__ == "__main__":
    sys.exit(main())
