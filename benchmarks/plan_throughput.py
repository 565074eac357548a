"""The speed a `preclint plan` keeps: throughput all-low, with the plan, and all-float32, on a GPU.

Per model: `preclint plan` (its prediction from the CPU reference pass at batch 1, verified on the
GPU) for the precision and tolerance given, then images (or tokens) per second at a serving batch
size under three settings, each in one run of this script:

* all-low: ``torch.autocast('cuda', dtype)`` around the plain model (``-full`` modes: ``.to(dtype)``);
* plan: the same with ``preclint.policy.apply_policy(model, plan)``;
* float32: the plain model, TF32 off (cuDNN and cuBLAS), the numbers the plan is measured against.

Models: resnet50, vit_b_16, fasterrcnn_resnet50_fpn (torchvision, weights=None) and a 1.2B-parameter
Llama built from its config (transformers, random init). The tolerance is rtol plus atol = ATOL_REL x
RMS of the reference output, for each ATOL_REL given: a loose one where the right plan is often
empty, and a tight one that makes the plan keep layers.

    python benchmarks/plan_throughput.py --out benchmarks/results/plan_throughput_h200.json
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import sys
import time
import traceback
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.provenance import stamp  # noqa: E402


def build(name: str, batch: int) -> Tuple[torch.nn.Module, Callable[[int], tuple], str]:
    """(model, inputs for a batch size, unit of throughput)."""
    torch.manual_seed(0)
    if name in ("resnet50", "vit_b_16"):
        import torchvision

        model = getattr(torchvision.models, name)(weights=None)
        return model, lambda b: (torch.randn(b, 3, 224, 224),), "images"
    if name == "fasterrcnn_resnet50_fpn":
        import torchvision

        model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights=None, weights_backbone=None)
        return model, lambda b: ([torch.rand(3, 800, 800) for _ in range(b)],), "images"
    if name == "llama_1b":
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                             num_key_value_heads=8, vocab_size=128256, max_position_embeddings=4096,
                             tie_word_embeddings=True, attn_implementation="sdpa", use_cache=False)
        model = LlamaForCausalLM(config)
        return model, lambda b: (torch.randint(0, config.vocab_size, (b, 512 if b > 1 else 128)),), "sequences"
    raise SystemExit(f"unknown model {name}")


def make_plan(model, inputs, precision: str, rtol: float, atol_rel: float) -> Dict[str, Any]:
    from preclint.config import Config
    from preclint.engine import CheckOptions, check_model
    from preclint.load.loader import LoadedModel
    from preclint.load.modelio import output_tensors
    from preclint.measure.compare import Tolerance
    from preclint.plan.command import build_plan

    with torch.no_grad():
        outs = [t.double() for t in output_tensors(copy.deepcopy(model).double()(
            *[_cast(a, torch.float64) for a in inputs])) if t.is_floating_point()]
    numel = sum(t.numel() for t in outs)
    rms = math.sqrt(sum(float((t * t).sum()) for t in outs) / max(numel, 1))
    atol = atol_rel * rms
    start = time.perf_counter()
    loaded = LoadedModel(model, tuple(inputs), "model", None)
    report, graph, _ = check_model(loaded, Config(precisions=(precision,)),
                                   CheckOptions(modes=(precision,), rtol=rtol, atol=atol))
    plan = build_plan(loaded, graph, report.findings, precision, Tolerance(rtol, atol), device="auto")
    data = plan.to_json()
    data["wall_s"] = time.perf_counter() - start
    return data


def _cast(value, dtype):
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


def throughput(model, inputs, setting: str, precision: str, plan: Optional[dict], iters: int, warmup: int) -> float:
    from preclint.policy import LOW_DTYPES, apply_policy

    low = LOW_DTYPES[precision.split("-")[0]]
    full = precision.endswith("-full")
    model = copy.deepcopy(model).cuda().eval()
    inputs = _to(inputs, "cuda")
    if setting == "plan":
        apply_policy(model, plan)
    elif setting == "all-low" and full:
        model.to(low)
    if full and setting != "float32":
        inputs = _cast(inputs, low)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    autocast = setting != "float32" and not full

    def step():
        with torch.no_grad(), torch.autocast("cuda", dtype=low, enabled=autocast):
            model(*inputs)

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        step()
    torch.cuda.synchronize()
    return iters / (time.perf_counter() - start)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,vit_b_16,fasterrcnn_resnet50_fpn,llama_1b")
    parser.add_argument("--precision", default="fp16")
    parser.add_argument("--rtol", type=float, default=1e-2)
    parser.add_argument("--atol-rel", default="1e-2,1e-3", help="comma-separated: atol as a fraction of the output RMS")
    parser.add_argument("--batch", type=int, default=0, help="serving batch (default: 64 images, 4 detector images, 8 sequences)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "plan_throughput_h200.json"))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("plan_throughput.py measures throughput on a GPU: no CUDA device here")
    rows = []
    for name in args.models.split(","):
        batch = args.batch or {"fasterrcnn_resnet50_fpn": 4, "llama_1b": 8}.get(name, 64)
        model, inputs_for, unit = build(name, batch)
        model.eval()
        row: Dict[str, Any] = {"model": name, "batch": batch, "unit": unit, "precision": args.precision, "plans": []}
        try:
            serving = inputs_for(batch)
            row["float32_per_s"] = batch * throughput(model, serving, "float32", args.precision, None, args.iters, args.warmup)
            row["all_low_per_s"] = batch * throughput(model, serving, "all-low", args.precision, None, args.iters, args.warmup)
            for atol_rel in [float(a) for a in args.atol_rel.split(",")]:
                entry: Dict[str, Any] = {"atol_rel": atol_rel}
                try:
                    plan = make_plan(model, inputs_for(1), args.precision, args.rtol, atol_rel)
                    entry.update(keep=[(k["module"], k["op"]) for k in plan["keep"]],
                                 kept_flops_fraction=plan["kept_flops_fraction"], meets=plan["meets_tolerance"],
                                 measured=plan.get("measured"), predicted=plan["predicted"], plan_wall_s=plan["wall_s"],
                                 notes=plan["notes"])
                    entry["plan_per_s"] = batch * throughput(model, serving, "plan", args.precision, plan, args.iters,
                                                             args.warmup)
                    entry["plan_vs_all_low"] = entry["plan_per_s"] / row["all_low_per_s"]
                    entry["plan_vs_float32"] = entry["plan_per_s"] / row["float32_per_s"]
                except Exception as exc:
                    entry["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
                    traceback.print_exc()
                row["plans"].append(entry)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            traceback.print_exc()
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items()}, default=str)[:2000], flush=True)
        del model
        torch.cuda.empty_cache()
    result = {"machine": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "platform": platform.platform()},
              "rows": rows}
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(stamp(result), f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
