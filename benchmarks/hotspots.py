"""Benchmark: how far each layer's measured local error lies from what ordinary rounding gives its
kind of op (preclint/predict/ordinary.py: ordinary_local), and which PCL900 findings the zoo gets.

PCL900 reports a layer that holds a fifth of an output's error when its own error exceeds ordinary
rounding by EXCESS (3). This measures the ratio measured/ordinary over every rounding layer of the
zoo's healthy models, natively on a GPU or emulated, so that the factor rests on numbers:

    python benchmarks/hotspots.py --device cuda --models resnet50,vit_b_16,swin_t,tiny_gpt --out hot.json
    python benchmarks/hotspots.py --device cpu --models tiny_gpt,resnet18

Per model and mode it prints the largest ratio over layers with a share of 20% or more, the 99th
percentile and largest ratio over all layers whose local error is above float32's own (2^-17.5), and
the PCL900 findings with their messages.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.probe import _check as check  # noqa: E402
from benchmarks.provenance import stamp  # noqa: E402
from benchmarks.zoo import ZOO  # noqa: E402
from preclint.config import Config  # noqa: E402
from preclint.probe import ProbeOptions, measure_model, merge_into_report  # noqa: E402
from preclint.predict.ordinary import FLOAT32_NOISE, ordinary_local  # noqa: E402
from preclint.rules.model.unflagged_hotspot import MIN_SHARE  # noqa: E402

MODES = ("tf32", "fp16", "bf16")


def measure(name: str, device: str) -> dict:
    (entry,) = [z for z in ZOO if z.name == name]
    model, inputs = entry.build()
    report, graph, ctx = check(model, inputs, name)
    result = measure_model(model, inputs, graph, MODES, ProbeOptions(device=device))
    merge_into_report(report, ctx, result, Config(precisions=MODES))
    out = {"model": name, "environment": result.environment, "modes": {},
           "pcl900": [f.message for f in report.findings if f.code == "PCL900"]}
    for mode, m in result.modes.items():
        ratios, large = [], []
        for node_name, nm in m.nodes.items():
            local = nm.local.rel_error if nm.local is not None else None
            node = graph.get(node_name)
            ordinary = ordinary_local(node, mode, nm.dtype) if node is not None else None
            if local is None or ordinary is None or local < FLOAT32_NOISE:
                continue
            ratios.append(local / ordinary)
            if (nm.contribution or 0.0) >= MIN_SHARE:
                large.append((local / ordinary, node_name))
        ratios.sort()
        out["modes"][mode] = {
            "layers": len(ratios),
            "p99_ratio": ratios[int(0.99 * (len(ratios) - 1))] if ratios else None,
            "max_ratio": ratios[-1] if ratios else None,
            "large_share_layers": sorted(large, reverse=True),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--models", default="resnet50,vit_b_16,swin_t,tiny_gpt")
    parser.add_argument("--out", help="write the figures as JSON here")
    args = parser.parse_args()
    rows = [measure(name, args.device) for name in args.models.split(",")]
    for row in rows:
        for mode, m in row["modes"].items():
            large = ", ".join(f"{n} {r:.2f}x" for r, n in m["large_share_layers"][:3]) or "-"
            print(f"{row['model']:22s} {mode:5s} layers {m['layers']:4d}  p99 {m['p99_ratio'] or 0:.2f}x  "
                  f"max {m['max_ratio'] or 0:.2f}x  share>=20%: {large}")
        for message in row["pcl900"]:
            print(f"  PCL900: {message}")
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(stamp({"models": rows}), handle, indent=1, default=str)


if __name__ == "__main__":
    main()
