"""Issue 26's numbers, as a new user meets them: predicted against measured output error on the model
files the issue names (a bare patch-embedding conv, a training script's small CNN, standardised convs,
timm's NF-ResNet), each checked by the CLI in a subprocess with ``--probe DEVICE``; and, with
``--detector``, the wall time and peak memory of checking torchvision's Faster R-CNN on one 320 px
image (``/usr/bin/time -v``, two threads: what a CI job has).

    python benchmarks/new_user_numbers.py --device cpu --out benchmarks/results/new_user_numbers_cpu.json
    python benchmarks/new_user_numbers.py --device cuda --out benchmarks/results/new_user_numbers_h200.json
    python benchmarks/new_user_numbers.py --device cpu --detector --models none --out detector.json

Per model and precision it records the predicted relative RMS error (and the float32-kernel figure of
a TF32 prediction, where the backend chooses kernels), the measured one and their ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import ROOT, stamp  # noqa: E402

MODELS: Dict[str, tuple] = {
    "patch_embedding": ("""\
import torch
torch.manual_seed(0)
model = torch.nn.Conv2d(3, 384, kernel_size=14, stride=14).eval()
example_inputs = (torch.rand(1, 3, 224, 224),)
""", "tf32,fp16-full"),
    "small_cnn": ("""\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(9216, 128), nn.ReLU(), nn.Linear(128, 10)).eval()
example_inputs = (torch.rand(8, 1, 28, 28),)
""", "tf32,bf16"),
    "nf_resnet26": ("""\
import torch
import timm
torch.manual_seed(0)
model = timm.create_model("nf_resnet26", pretrained=False).eval()
example_inputs = (torch.rand(1, 3, 64, 64),)
""", "tf32,fp16,bf16"),
}

DETECTOR = """\
import torch
import torchvision
torch.manual_seed(0)
model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None, min_size=320,
                                                             max_size=320).eval()
example_inputs = ([torch.rand(3, 320, 320)],)
"""


def _env() -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.setdefault("OMP_NUM_THREADS", "2")
    return env


def check_model(name: str, source: str, modes: str, device: str, directory: str) -> Dict:
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as f:
        f.write(source)
    cmd = [sys.executable, "-m", "preclint", "check", path, "--precision", modes, "--probe", device,
           "--output-format", "json", "--exit-zero", "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=directory)
    entry: Dict = {"wall_s": round(time.perf_counter() - start, 1), "exit": done.returncode}
    if done.returncode != 0:
        entry["error"] = done.stderr.strip().splitlines()[-1:] or ["?"]
        return entry
    report = json.loads(done.stdout)
    for mode, summary in report["summary"].items():
        predicted = summary["predicted_output"]["rel_error"]
        measured = (summary.get("measured_output") or {}).get("rel_error")
        row = {"predicted": predicted, "measured": measured}
        if summary.get("if_float32_kernels"):
            row["predicted_if_float32_kernels"] = summary["if_float32_kernels"]["rel_error"]
        if predicted and measured:
            row["measured_over_predicted"] = round(measured / predicted, 3)
        entry[mode] = row
    return entry


def time_detector(directory: str) -> Dict:
    """`preclint check` of Faster R-CNN at 320 px under /usr/bin/time -v: wall seconds and peak RSS."""
    path = os.path.join(directory, "fasterrcnn.py")
    with open(path, "w") as f:
        f.write(DETECTOR)
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "preclint", "check", path, "--output-format", "json",
           "--exit-zero", "--quiet"]
    env = _env()
    env["OMP_NUM_THREADS"] = "2"
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=directory)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", done.stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    seconds = None
    if wall:
        parts = [float(p) for p in wall.group(1).split(":")]
        seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return {"exit": done.returncode, "wall_s": seconds, "max_rss_mib": int(rss.group(1)) / 1024 if rss else None,
            "threads": 2, "load_average_1min": load}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated, or none")
    parser.add_argument("--detector", action="store_true", help="also time the Faster R-CNN check (2 threads)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    names = [] if args.models == "none" else args.models.split(",")
    result: Dict = {"device": args.device, "models": {}}
    with tempfile.TemporaryDirectory() as directory:
        for name in names:
            source, modes = MODELS[name]
            result["models"][name] = check_model(name, source, modes, args.device, directory)
            print(name, json.dumps(result["models"][name]), flush=True)
        if args.detector:
            result["detector"] = time_detector(directory)
            print("detector", json.dumps(result["detector"]), flush=True)
    with open(args.out, "w") as f:
        json.dump(stamp(result), f, indent=2)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
