"""Every torchvision detector family, judged by its decisions: `preclint check --probe cpu` on each, random
init (``weights=None``, what a user gets without downloading), small inputs, score thresholds lowered so
that random-init heads produce detections.

Per detector and precision it records what preclint predicted (PCL301 findings under that precision:
the largest predicted fraction of flipped decisions over the decision sites, and each site's verdict)
against what the CPU probe measured (the detections matched to the float64 reference's: kept, moved,
relabelled, lost, added, the fraction changed; masks' and keypoints' changes), and per output (boxes,
scores, masks, keypoints, keypoint scores) the predicted relative error against the measured one over the
kept detections.

A pair "decisions predicted" holds when PCL301 fires under the precision wherever the probe measured
detections that changed (and stays silent where none did); "within 3x" compares the largest predicted
flip fraction of a site with the fraction of detections changed.

    python benchmarks/detectors.py --out benchmarks/results/detectors_cpu.json --label after
    PRECLINT_ROOT=/path/to/other/checkout python benchmarks/detectors.py --out ... --label before
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.coverage_accuracy import factor  # noqa: E402
from benchmarks.provenance import run_provenance, store_labelled  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("tf32", "fp16", "bf16")
WITHIN = 3.0

MODEL_FILE = """\
import torch
import torchvision

torch.manual_seed(0)
model = torchvision.models.detection.{name}(weights=None, weights_backbone=None{extra}).eval()
example_inputs = ([torch.rand(3, {size}, {size})],)
"""

# name -> (constructor keywords, image side). SSDlite resizes every image to 320 and passes scores
# above 0.001 by default (all of its random-init ones); the others resize to min_size, and their
# score thresholds are lowered to 0 so that random-init heads give detections. Mask and Keypoint
# R-CNN run at 64 pixels with fewer proposals and classes: they take minutes on a shared CPU otherwise.
DETECTORS = {
    "ssdlite320_mobilenet_v3_large": ("", 128),
    "retinanet_resnet50_fpn": (", min_size=128, max_size=128, score_thresh=0.0, detections_per_img=20", 128),
    "fcos_resnet50_fpn": (", min_size=128, max_size=128, score_thresh=0.0, detections_per_img=20", 128),
    "fasterrcnn_mobilenet_v3_large_320_fpn": (", min_size=128, max_size=128, box_score_thresh=0.0, "
                                              "box_detections_per_img=20", 128),
    "maskrcnn_resnet50_fpn": (", min_size=64, max_size=64, box_score_thresh=0.0, box_detections_per_img=8, "
                              "rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=20, num_classes=3", 64),
    "keypointrcnn_resnet50_fpn": (", min_size=64, max_size=64, box_score_thresh=0.0, box_detections_per_img=8, "
                                  "rpn_pre_nms_top_n_test=100, rpn_post_nms_top_n_test=20, num_keypoints=5", 64),
}


def check(name: str, timeout: float) -> Dict:
    """The JSON report of `preclint check --probe cpu` on detector ``name`` (or why there is none)."""
    extra, size = DETECTORS[name]
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONPATH=os.environ.get("PRECLINT_ROOT", ROOT))
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, f"{name}.py")
        with open(path, "w") as handle:
            handle.write(MODEL_FILE.format(name=name, extra=extra, size=size))
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "preclint", "check", path, "--probe", "cpu",
                                   "--precision", ",".join(MODES), "--output-format", "json", "--exit-zero"],
                                  capture_output=True, text=True, timeout=timeout, env=env, cwd=directory)
        except subprocess.TimeoutExpired:
            return {"error": f"timed out after {timeout:.0f} s"}
        seconds = round(time.perf_counter() - start, 1)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1], "seconds": seconds}
    return {"report": json.loads(done.stdout), "seconds": seconds}


def judge(report: Dict) -> Dict[str, Dict]:
    """mode -> predicted and measured decisions and per-output errors of one report."""
    decisions = [f for f in report.get("findings", []) if f["code"] == "PCL301"]
    rows = {}
    for mode in MODES:
        entry = (report.get("summary") or {}).get(mode) or {}
        measured = entry.get("measured_output") or {}
        detections = measured.get("detections")
        sites = [{"op": f.get("op"), "predicted_flips": _rounded(((f.get("predicted") or {}).get(mode) or {}).get("flip_fraction")),
                  "measured_flips": _rounded(((f.get("measured") or {}).get(mode) or {}).get("flip_fraction")),
                  "status": f.get("status")}
                 for f in decisions if mode in (f.get("precisions") or [])]
        predicted = max((s["predicted_flips"] or 0.0 for s in sites), default=0.0)
        changed = detections.get("flip_fraction") if detections else None
        row: Dict = {"pcl301_sites": len(sites), "predicted_flips": predicted, "measured_detections": detections,
                     "sites": sites}
        if changed is not None:
            row["decisions_predicted"] = bool(sites) == (changed > 0)
            row["flips_factor"] = _rounded(max(predicted, changed) / min(predicted, changed)) \
                if predicted > 0 and changed > 0 else None
            row["flips_within_3x"] = row["flips_factor"] is not None and row["flips_factor"] <= WITHIN
        outputs = []
        for p, m in zip(entry.get("outputs") or [], measured.get("outputs") or [None] * len(entry.get("outputs") or [])):
            p_err, m_err = (p or {}).get("rel_error"), (m or {}).get("rel_error")
            outputs.append({"output": (p or {}).get("output"), "predicted": _rounded(p_err), "measured": _rounded(m_err),
                            "factor": _rounded(factor(p_err, m_err))})
        row["outputs"] = outputs
        rows[mode] = row
    return rows


def _rounded(x: Optional[float]) -> Optional[float]:
    return None if x is None else float(f"{x:.4g}")


def summarize(models: List[Dict]) -> Dict:
    pairs = [row for m in models for row in (m.get("modes") or {}).values() if "decisions_predicted" in row]
    outputs = [o for m in models for row in (m.get("modes") or {}).values() for o in row["outputs"]
               if o["factor"] is not None]
    return {
        "models": len(models),
        "checked": sum(1 for m in models if "error" not in m),
        "pairs": len(pairs),
        "decisions_predicted": sum(1 for r in pairs if r["decisions_predicted"]),
        "flips_within_3x": sum(1 for r in pairs if r.get("flips_within_3x")),
        "output_pairs": len(outputs),
        "outputs_within_3x": sum(1 for o in outputs if o["factor"] <= WITHIN),
        "outputs_measured": sum(1 for m in models for row in (m.get("modes") or {}).values() for o in row["outputs"]
                                if o["measured"] is not None),
        "outputs_predicted": sum(1 for m in models for row in (m.get("modes") or {}).values() for o in row["outputs"]),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="after", help="the key the run is stored under in --out")
    parser.add_argument("--models", default=",".join(DETECTORS))
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args(argv)
    models = []
    for name in args.models.split(","):
        result = check(name, args.timeout)
        entry: Dict = {"model": name, "config": DETECTORS[name][0].lstrip(", "), "image": DETECTORS[name][1],
                       "seconds": result.get("seconds")}
        if "error" in result:
            entry["error"] = result["error"]
        else:
            entry["modes"] = judge(result["report"])
            entry["capture"] = result["report"].get("capture")
        models.append(entry)
        print(name, json.dumps({m: (r.get("pcl301_sites"), r.get("predicted_flips"),
                                    (r.get("measured_detections") or {}).get("flip_fraction"))
                                for m, r in (entry.get("modes") or {}).items()}) if "modes" in entry else entry["error"],
              flush=True)
    # each label keeps its own provenance (the file's is the last run's); PRECLINT_ROOT: whose preclint checked
    record = {"provenance": run_provenance(), "preclint_root": "other checkout" if os.environ.get("PRECLINT_ROOT") else "this one",
              "models": models, "summary": summarize(models)}
    store_labelled(args.out, args.label, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
