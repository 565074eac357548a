"""Does `preclint check` (and `--probe cpu`) run on every model torchvision lists?

Each model of ``torchvision.models.list_models()`` is built with ``weights=None`` (seed 0) in a
small model file, with an input that runs in seconds on a CPU, and checked by the CLI in a
subprocess of its own with a timeout; the probe runs after a check that succeeded. Per model and
command it records the exit code, the wall time, the peak RSS of the child, the capture path, the
findings by code and, for a failure, the last line the command printed. A signal, a traceback
("internal error") or a timeout is a bug of preclint; an exit code of 2 with one line is preclint
saying what it could not do.

    python benchmarks/coverage_torchvision.py --out benchmarks/results/coverage_torchvision.json
    python benchmarks/coverage_torchvision.py --models resnet18,raft_small --no-probe
    python benchmarks/coverage_torchvision.py --probe-device cuda --detector-size 0 --models fasterrcnn_resnet50_fpn
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

# Inputs by family: small enough for seconds on a CPU, large enough for every architecture.
# ViT, MaxViT and MViT embed positions for one input size, S3D pools a fixed window at the end;
# RAFT needs sides divisible by 8.
IMAGE = "torch.rand(1, 3, 64, 64)"
FIXED_224 = "torch.rand(1, 3, 224, 224)"
SPECIAL_INPUTS = {
    "inception_v3": "torch.rand(1, 3, 96, 96)",  # 75x75 at least
    "quantized_inception_v3": "torch.rand(1, 3, 96, 96)",
    "maxvit_t": FIXED_224,
    "mvit_v1_b": "torch.rand(1, 3, 16, 224, 224)",
    "mvit_v2_s": "torch.rand(1, 3, 16, 224, 224)",
    "s3d": "torch.rand(1, 3, 16, 224, 224)",  # its last pooling window is 2x7x7
}
VIDEO = "torch.rand(1, 3, 4, 64, 64)"
DETECTION_IMAGE = "[torch.rand(3, 128, 128)]"
FLOW = "torch.rand(1, 3, 128, 128), torch.rand(1, 3, 128, 128)"


def family(name: str) -> str:
    import torchvision.models as tvm

    for fam, module in (("detection", tvm.detection), ("segmentation", tvm.segmentation), ("video", tvm.video),
                        ("optical_flow", tvm.optical_flow), ("quantized", tvm.quantization)):
        if name in tvm.list_models(module=module):
            return fam
    return "classification"


def example_inputs(name: str, fam: str) -> str:
    if name in SPECIAL_INPUTS:
        return SPECIAL_INPUTS[name]
    if name.startswith("vit_"):
        return FIXED_224
    if fam == "detection":
        return DETECTION_IMAGE
    if fam == "video":
        return VIDEO
    if fam == "optical_flow":
        return FLOW
    return IMAGE


MODEL_FILE = """\
import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.get_model({name!r}, weights=None{extra}).eval()
example_inputs = ({inputs},)
"""


def run(cmd: List[str], timeout: float, env: Optional[Dict[str, str]] = None) -> Dict:
    """Exit code (negative: the signal), wall seconds, peak RSS (MiB) and output of one command."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, start_new_session=True, env=env)
        rc, usage, timed_out = None, None, False
        while rc is None:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                rc = os.waitstatus_to_exitcode(status)
                break
            if time.perf_counter() - start > timeout:
                os.killpg(proc.pid, signal.SIGKILL)
                _, status, usage = os.wait4(proc.pid, 0)
                rc, timed_out = None, True
                break
            time.sleep(0.2)
        proc.returncode = rc if rc is not None else -9
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    return {"rc": rc, "timed_out": timed_out, "wall_s": round(wall, 1),
            "rss_mib": round(usage.ru_maxrss / 1024) if usage is not None else None,
            "stdout": stdout, "stderr": stderr}


def outcome(result: Dict) -> Dict:
    """What a run tells: ok or the kind of failure, with its one line."""
    entry = {k: result[k] for k in ("rc", "wall_s", "rss_mib")}
    report = None
    if result["rc"] in (0, 1):
        try:
            report = json.loads(result["stdout"])
        except ValueError:
            report = None
    if result["timed_out"]:
        entry["status"] = "timeout"
    elif result["rc"] is not None and result["rc"] < 0:
        entry["status"] = f"signal {-result['rc']}"
    elif report is not None:
        entry["status"] = "ok"
    elif "internal error" in result["stderr"] or "Traceback" in result["stderr"]:
        entry["status"] = "traceback"
    elif result["rc"] == 2:
        entry["status"] = "refused"  # one line that says why: preclint's answer, not a crash
    else:
        entry["status"] = "failed"
    if entry["status"] != "ok":
        lines = [line for line in result["stderr"].strip().splitlines() if line.strip()]
        entry["error"] = lines[-1][:300] if lines else ""
    if report is not None:
        entry["capture"] = report.get("capture")
        codes: Dict[str, int] = {}
        for f in report.get("findings", []):
            codes[f["code"]] = codes.get(f["code"], 0) + 1
        entry["findings"] = dict(sorted(codes.items()))
        notes = [n for n in report.get("notes", []) if "could not" in n or "not measured" in n or "without" in n]
        if notes:
            entry["notes"] = [n[:200] for n in notes]
        unmeasured = {mode: s["measured_output"]["error"] for mode, s in report.get("summary", {}).items()
                      if "error" in s.get("measured_output", {})}
        if unmeasured:
            entry["modes_not_measured"] = unmeasured
        detections = {mode: {k: v for k, v in s["measured_output"]["detections"].items()
                             if k in ("reference", "kept", "moved", "relabelled", "lost", "added", "flip_fraction")}
                      for mode, s in report.get("summary", {}).items() if "detections" in s.get("measured_output", {})}
        if detections:
            entry["detections"] = detections
    return entry


def cover(name: str, directory: str, timeout: float, probe: Optional[str], env: Optional[Dict[str, str]] = None,
          detector_size: Optional[int] = 128) -> Dict:
    fam = family(name)
    inputs = example_inputs(name, fam)
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w") as f:
        # detectors and segmenters would fetch ImageNet weights for their backbone by default
        extra = ", weights_backbone=None" if fam in ("detection", "segmentation") else ""
        if fam == "detection" and not name.startswith("ssd") and detector_size:
            # R-CNN, RetinaNet and FCOS resize every image to 800 pixels first; SSD's size is fixed
            extra += f", min_size={detector_size}, max_size={detector_size}"
        f.write(MODEL_FILE.format(name=name, inputs=inputs, extra=extra))
    base = [sys.executable, "-m", "preclint", "check", path, "--output-format", "json", "--exit-zero"]
    entry: Dict = {"model": name, "family": fam, "inputs": inputs}
    entry["check"] = outcome(run(base, timeout, env))
    if probe and entry["check"]["status"] == "ok":
        entry["probe"] = outcome(run(base + ["--probe", probe], timeout, env))
    return entry


def summarize(entries: List[Dict]) -> Dict:
    def count(key, status="ok"):
        return sum(1 for e in entries if e.get(key, {}).get("status") == status)

    captures: Dict[str, int] = {}
    failures: Dict[str, int] = {}
    for e in entries:
        c = e["check"].get("capture")
        if c:
            captures[c] = captures.get(c, 0) + 1
        for key in ("check", "probe"):
            status = e.get(key, {}).get("status")
            if status and status != "ok":
                failures[f"{key}: {status}"] = failures.get(f"{key}: {status}", 0) + 1
    walls = sorted(e["check"]["wall_s"] for e in entries)
    probe_walls = sorted(e["probe"]["wall_s"] for e in entries if "probe" in e)
    return {
        "models": len(entries),
        "captured": captures,
        "check_ok": count("check"),
        "probe_ok": count("probe"),
        "probe_run": sum(1 for e in entries if "probe" in e),
        "failures": dict(sorted(failures.items())),
        "check_wall_s": {"median": walls[len(walls) // 2] if walls else None, "max": walls[-1] if walls else None,
                         "total": round(sum(walls), 1)},
        "probe_wall_s": {"median": probe_walls[len(probe_walls) // 2] if probe_walls else None,
                         "max": probe_walls[-1] if probe_walls else None, "total": round(sum(probe_walls), 1)},
        "max_rss_mib": max((e[k]["rss_mib"] or 0) for e in entries for k in ("check", "probe") if k in e),
    }


def compare(paths: List[str]) -> str:
    """A markdown table of result files side by side (e.g. before and after a change), then every
    model that is not ok in the last of them."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    rows = [("models", lambda s: s["models"]),
            ("captured by fx / function-mode", lambda s: f"{s['captured'].get('fx', 0)} / {s['captured'].get('function-mode', 0)}"),
            ("check ok", lambda s: s["check_ok"]),
            ("probe (cpu) ok / run", lambda s: f"{s['probe_ok']} / {s['probe_run']}" if s["probe_run"] else "not run"),
            ("failures", lambda s: ", ".join(f"{k} {v}" for k, v in s["failures"].items()) or "none"),
            ("check wall s: median / max / total", lambda s: "{median} / {max} / {total}".format(**s["check_wall_s"])),
            ("probe wall s: median / max / total",
             lambda s: "{median} / {max} / {total}".format(**s["probe_wall_s"]) if s["probe_run"] else "-"),
            ("largest peak RSS (MiB)", lambda s: s["max_rss_mib"])]
    lines = ["| | " + " | ".join(os.path.basename(p) for p in paths) + " |", "|---" * (len(paths) + 1) + "|"]
    for label, value in rows:
        lines.append(f"| {label} | " + " | ".join(str(value(r["summary"])) for r in runs) + " |")
    failing = [e for e in runs[-1]["models"] if any(e.get(k, {}).get("status") not in (None, "ok") for k in ("check", "probe"))]
    for e in failing:
        for key in ("check", "probe"):
            if e.get(key, {}).get("status") not in (None, "ok"):
                lines.append(f"- {e['model']}: {key} {e[key]['status']}: {e[key].get('error', '')}")
    return "\n".join(lines)


def machine() -> Dict:
    import torch
    import torchvision

    return {"python": platform.python_version(), "torch": torch.__version__, "torchvision": torchvision.__version__,
            "cpu": platform.machine(), "cores": os.cpu_count()}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all of torchvision.models.list_models())")
    parser.add_argument("--skip", help="comma-separated names to leave out")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per command (default 600)")
    parser.add_argument("--no-probe", action="store_true", help="check only")
    parser.add_argument("--probe-device", default="cpu", choices=("cpu", "cuda"), help="where the probe runs (default cpu)")
    parser.add_argument("--detector-size", type=int, default=128,
                        help="min_size and max_size of R-CNN, RetinaNet and FCOS detectors (0: their default, 800)")
    parser.add_argument("--out", help="write the results as JSON here (rewritten after every model)")
    parser.add_argument("--resume", action="store_true", help="keep the models --out already holds, run the rest")
    parser.add_argument("--compare", nargs="+", metavar="FILE", help="print result files side by side and exit")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS of each command (on a shared machine, 1 "
                        "avoids threads waiting on each other)")
    args = parser.parse_args(argv)
    if args.compare:
        print(compare(args.compare))
        return 0
    env = dict(os.environ)
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)

    import torchvision

    names = args.models.split(",") if args.models else torchvision.models.list_models()
    skip = set(args.skip.split(",")) if args.skip else set()
    names = [n for n in names if n not in skip]
    entries: List[Dict] = []
    if args.resume and args.out and os.path.exists(args.out):
        with open(args.out) as f:
            entries = json.load(f)["models"]
    done = {e["model"] for e in entries}
    with tempfile.TemporaryDirectory() as directory:
        for name in [n for n in names if n not in done]:
            entry = cover(name, directory, args.timeout, probe=None if args.no_probe else args.probe_device, env=env,
                          detector_size=args.detector_size)
            entries.append(entry)
            check, probe = entry["check"], entry.get("probe", {})
            print(f"{name:40s} {check.get('capture') or '-':14s} check {check['status']:9s} {check['wall_s']:6.1f}s "
                  f"{check['rss_mib'] or 0:6d}MiB  probe {probe.get('status', '-'):9s} {probe.get('wall_s', 0):6.1f}s "
                  f"{probe.get('rss_mib') or 0:6d}MiB  {check.get('error') or probe.get('error') or ''}", flush=True)
            if args.out:
                with open(args.out, "w") as f:
                    json.dump({"machine": machine(), "threads": args.threads, "probe_device": args.probe_device,
                               "detector_size": args.detector_size, "summary": summarize(entries),
                               "models": entries}, f, indent=1)
                    f.write("\n")
    print(json.dumps(summarize(entries), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
