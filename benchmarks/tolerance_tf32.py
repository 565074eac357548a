"""A ResNet-101 expected-output test under TF32: preclint's tolerance against assert_close's default.

torchvision's model tests record a random-init model's output in float32 on the CPU and compare later
runs with it. Under TF32 (cuDNN's default for float32 convolutions on Ampere and newer) resnet101's
test fails. This benchmark records the output as torchvision does, runs the model under TF32 on
``--device`` (the GPU's own TF32, or emulated on the CPU), and compares:

* with torch.testing.assert_close's default float32 tolerance (rtol 1.3e-6, atol 1e-5): fails;
* with preclint.testing's tolerance for TF32, predicted (the error model, on the CPU) and measured
  (a run on the device against float64): passes;
* the same with one weight scaled by 1.01 (the stem's convolution, then the classifier): fails, and
  preclint.testing.assert_close calls it a real change.

    python benchmarks/tolerance_tf32.py --device cpu --size 64 --out benchmarks/results/tolerance_tf32_cpu.json
    python benchmarks/tolerance_tf32.py --device cuda --size 224 --out benchmarks/results/tolerance_tf32_h200.json
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torchvision  # noqa: E402

import preclint.testing  # noqa: E402
from benchmarks.provenance import stamp  # noqa: E402
from preclint.testing.comparison import difference  # noqa: E402

PERTURBED = ("conv1.weight", "fc.weight")  # one weight each time, scaled by 1.01


def passes(actual, expected, **tolerance) -> bool:
    try:
        torch.testing.assert_close(actual, expected, check_dtype=False, **tolerance)
    except AssertionError:
        return False
    return True


def judged(actual, expected, model, x, tol) -> dict:
    """preclint.testing.assert_close's verdict, and the difference it measured."""
    output = tol[0]
    found = difference(actual, expected, output)
    try:
        preclint.testing.assert_close(actual, expected, model=model, inputs=x, precision="tf32", tolerance=tol)
        verdict = "pass"
    except AssertionError as failure:
        verdict = "real change" if "a real change" in str(failure) else "precision difference"
    return {"verdict": verdict, "diff_rms": found.rms, "diff_max": found.largest, "times_sigma": found.times_sigma,
            "failing": found.failing, "numel": found.numel}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--arch", default="resnet101", help="a torchvision classifier (random init)")
    parser.add_argument("--size", type=int, default=224, help="the input's side (torchvision's test: 224)")
    parser.add_argument("--out", help="the results file (JSON)")
    args = parser.parse_args()
    timings = {}
    start = time.perf_counter()
    torch.manual_seed(0)
    model = getattr(torchvision.models, args.arch)(num_classes=50).eval()  # as torchvision's test builds it
    x = torch.rand(1, 3, args.size, args.size)
    with torch.no_grad():
        expected = model(x)  # recorded as torchvision records it: float32 on the CPU
    timings["expected"] = time.perf_counter() - start

    start = time.perf_counter()
    predicted = preclint.testing.tolerance(model, x, "tf32")
    timings["tolerance_predicted"] = time.perf_counter() - start
    start = time.perf_counter()
    measured = preclint.testing.tolerance(model, x, "tf32", probe=args.device)
    # (a failure names the layers that carry the error: from the predicted check, made once)
    measured = dataclasses.replace(measured, report=predicted.report)
    timings["tolerance_measured"] = time.perf_counter() - start

    start = time.perf_counter()
    actual = preclint.testing.output_under(model, x, "tf32", device=args.device).cpu()
    timings["run_tf32"] = time.perf_counter() - start
    rows = {"default": {"passes": passes(actual, expected)}}
    for name, tol in (("predicted", predicted), ("measured", measured)):
        rows[name] = {"rtol": tol.rtol, "atol": tol.atol, "sigma": tol[0].sigma, "passes": passes(actual, expected, **tol.kwargs()),
                      **judged(actual, expected, model, x, tol)}
    perturbed = {}
    start = time.perf_counter()
    for weight in PERTURBED:
        changed = getattr(torchvision.models, args.arch)(num_classes=50).eval()
        changed.load_state_dict(model.state_dict())
        with torch.no_grad():
            dict(changed.named_parameters())[weight].mul_(1.01)
        out = preclint.testing.output_under(changed, x, "tf32", device=args.device).cpu()
        perturbed[weight] = {name: {"passes": passes(out, expected, **tol.kwargs()),
                                    **judged(out, expected, model, x, tol)}
                             for name, tol in (("predicted", predicted), ("measured", measured))}
    timings["perturbed"] = time.perf_counter() - start
    result = {"model": args.arch, "input": [1, 3, args.size, args.size], "device": args.device,
              "tf32": "native" if args.device == "cuda" else "emulated",
              "output_rms": predicted[0].value_rms, "tolerances": rows, "perturbed_by_1_percent": perturbed,
              "timings_s": {k: round(v, 1) for k, v in timings.items()}}
    if args.device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()
    text = json.dumps(stamp(result), indent=1, default=str)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    ok = (not rows["default"]["passes"] and rows["predicted"]["passes"] and rows["measured"]["passes"]
          and all(not r["passes"] and r["verdict"] == "real change" for p in perturbed.values() for r in p.values()))
    print("acceptance:", "met" if ok else "NOT met", file=sys.stderr)


if __name__ == "__main__":
    main()
