"""`preclint plan` against ONNX Runtime's auto_convert_mixed_precision and ModelOpt AutoCast.

For each model and one tolerance (rtol, atol = ATOL_REL x RMS of the float64 output), every tool
makes a float16 model with some layers kept in float32, and each result is measured against a
float64 reference of the same model on the same inputs:

* preclint: `preclint plan --precision fp16-full` (the whole model in float16 but the kept layers,
  as an exported FP16 engine runs), measured in torch with the plan applied (preclint.policy), and
  again as ONNX: the exported model converted by onnxconverter-common with the plan's nodes blocked
  (preclint.policy.onnx_nodes_to_exclude), run in ONNX Runtime;
* ONNX Runtime: onnxconverter_common.auto_mixed_precision.auto_convert_mixed_precision(rtol, atol),
  its greedy search against the float32 ONNX model's own output;
* ModelOpt AutoCast: modelopt.onnx.autocast.convert_to_mixed_precision("fp16") with the inputs as
  calibration data (its magnitude rules: data_max=512, init_max=65504).

Whether a result meets the tolerance is measured in torch for every tool: the ONNX nodes an anchor
left in float32 are mapped back to the modules and ops they came from (the exporter's scope
metadata) and applied with preclint.policy, then run with torch's float16 kernels, which store
every result in float16 as a GPU does. ONNX Runtime's CPU provider is no judge here: it has no
float16 kernel for most ops and computes them in float32 (its InsertCastTransformer), so a float16
ONNX model run on the CPU is more accurate than on a GPU; its figures are recorded beside
(``onnx_runtime_cpu``), not counted.

Reported per tool: does the result meet the tolerance, the fraction of the FLOPs that stay in
float32 (counted on the ONNX graph for every tool: 2 K per output of Conv/Gemm/MatMul, one per
output element elsewhere), wall time, and for preclint the runs of the model it made with a plan.
Models: the rule pack's own bad and good examples and tests/models/plan_culprits.py (culprits that
are layers, an op, a parameter, the inputs; a healthy net); whether low
precision fails a model is measured (the all-float16 run against the tolerance), not assumed.

    /work/venv/bin/python benchmarks/plan_anchors.py --out benchmarks/results/plan_anchors_cpu.json
"""
from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import sys
import tempfile
import time
import traceback
import warnings
from typing import Any, Dict, List, Optional

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.provenance import stamp  # noqa: E402

ATOL_REL = 1e-2
RTOL = 1e-2
ALL_TOOLS = ("preclint", "ort_auto_mixed_precision", "modelopt_autocast")


# ------------------------------------------------------------------------------------------ models


def models(include_torchvision: bool) -> List[Dict[str, Any]]:
    from preclint.rules import all_rules
    from tests.models import plan_culprits

    out = []
    inputs = {"WideLayer": lambda: torch.randn(8, 64), "RMSHead": lambda: torch.randn(16, 32),
              "Healthy": lambda: torch.randn(2, 3, 16, 16), "TinyVariance": lambda: torch.randn(8, 16),
              "OffsetInputs": lambda: 1000.0 + 0.01 * torch.randn(8, 16)}
    for name, make in inputs.items():
        cls = getattr(plan_culprits, name)
        out.append({"name": f"plan_culprits.{name}", "description": (cls.__doc__ or "").split("\n")[0] or None,
                    "build": (lambda cls=cls, make=make: (cls(), (torch.manual_seed(0) and make(),)))})
    for code, rule in sorted(all_rules().items()):
        for kind in ("bad", "good"):
            for i, example in enumerate(getattr(rule, kind, ()) or ()):
                precisions = example.options.get("precisions")
                if precisions and not {"fp16", "fp16-full"} & set(precisions):
                    continue
                out.append({"name": f"{code}.{kind}{i}", "build": example.build, "description": example.description})
    if include_torchvision:
        import torchvision

        for name in ("resnet18", "resnet50", "mobilenet_v3_small"):
            out.append({"name": f"torchvision.{name}",
                        "build": (lambda name=name: (_tv(torchvision, name), (torch.manual_seed(0) and torch.randn(1, 3, 64, 64),)))})
    return out


def _tv(torchvision, name):
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(weights=None)


# ------------------------------------------------------------------------------------------ judging


def flat(value) -> List[np.ndarray]:
    from preclint.load.modelio import output_tensors

    if isinstance(value, (list, tuple)) and value and isinstance(value[0], np.ndarray):
        return [np.asarray(v) for v in value]
    return [t.detach().double().cpu().numpy() if t.is_floating_point() else t.detach().cpu().numpy()
            for t in output_tensors(value)]


def judge(outputs: List[np.ndarray], reference: List[np.ndarray], rtol: float, atol: float) -> Dict[str, Any]:
    if len(outputs) != len(reference):
        return {"meets": False, "note": "a different number of outputs"}
    worst, failing, total, finite, sq_e, sq_r = 0.0, 0, 0, True, 0.0, 0.0
    for o, r in zip(outputs, reference):
        if o.shape != r.shape:
            return {"meets": False, "note": "an output changed shape"}
        if not np.issubdtype(r.dtype, np.floating):
            failing += int((o != r).sum())
            total += r.size
            continue
        d = o.astype(np.float64) - r
        if not np.isfinite(d).all():
            finite = False
            continue
        worst = max(worst, float(np.abs(d).max()) if d.size else 0.0)
        failing += int((np.abs(d) > atol + rtol * np.abs(r)).sum())
        total += d.size
        sq_e += float((d * d).sum())
        sq_r += float((r * r).sum())
    rel = math.sqrt(sq_e / sq_r) if sq_r > 0 else 0.0
    return {"meets": finite and failing == 0, "finite": finite, "failing": failing, "numel": total,
            "rel_error": rel if finite else None, "max_abs_error": worst if finite else None}


# --------------------------------------------------------------------------------------------- ONNX


def export(module, args) -> Any:
    import onnx

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buffer, dynamo=True, opset_version=18, optimize=False, verbose=False)
    return onnx.load_from_string(buffer.getvalue())


def onnx_flops(model) -> Dict[str, float]:
    """node name -> FLOPs, from shapes inferred on the float32 model."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {}
    for v in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        dims = [d.dim_value if d.HasField("dim_value") else 1 for d in v.type.tensor_type.shape.dim]
        shapes[v.name] = (dims, v.type.tensor_type.elem_type)
    for init in inferred.graph.initializer:
        shapes[init.name] = (list(init.dims), init.data_type)
    flops = {}
    for node in inferred.graph.node:
        out = shapes.get(node.output[0]) if node.output else None
        if out is None or out[1] not in (1, 10, 16):  # float, float16, bfloat16 results only
            continue
        numel = float(np.prod(out[0])) if out[0] else 1.0
        if node.op_type == "Conv" and len(node.input) > 1 and node.input[1] in shapes:
            w = shapes[node.input[1]][0]
            flops[node.name] = 2.0 * numel * float(np.prod(w[1:]))
        elif node.op_type in ("Gemm", "MatMul") and node.input and node.input[0] in shapes and shapes[node.input[0]][0]:
            flops[node.name] = 2.0 * numel * shapes[node.input[0]][0][-1]
        else:
            flops[node.name] = numel
    return flops


def float32_fraction(converted, flops: Dict[str, float]) -> float:
    """The share of the FLOPs whose node still computes in float32 in a converted model."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(converted)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    total = sum(flops.values()) or 1.0
    kept = 0.0
    for node in inferred.graph.node:
        if node.name in flops and node.output and types.get(node.output[0]) == 1:
            kept += flops[node.name]
    return kept / total


def ort_outputs(model, feeds) -> List[np.ndarray]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return [np.asarray(o).astype(np.float64) if np.issubdtype(np.asarray(o).dtype, np.floating) else np.asarray(o)
            for o in session.run(None, feeds)]


# --------------------------------------------------------------------------------------------- tools


def run_preclint(module, args, tol, fp32_onnx, feeds, flops, reference) -> Dict[str, Any]:
    from onnxconverter_common import float16

    from preclint.config import Config
    from preclint.engine import CheckOptions, check_model
    from preclint.load.loader import LoadedModel
    from preclint.measure.compare import Tolerance
    from preclint.plan.command import build_plan
    from preclint.plan.document import figure_json
    from preclint.policy import onnx_nodes_to_exclude

    start = time.perf_counter()
    config = Config(precisions=("fp16-full",))
    loaded = LoadedModel(module, tuple(args), "model", None)
    report, graph, _ = check_model(loaded, config, CheckOptions(modes=("fp16-full",), rtol=tol["rtol"], atol=tol["atol"]))
    plan = build_plan(loaded, graph, report.findings, "fp16-full", Tolerance(tol["rtol"], tol["atol"]), device="cpu")
    wall = time.perf_counter() - start
    measured = plan.measured or {}
    out = {"meets": plan.meets_tolerance, "kept_flops_fraction_graph": plan.kept_flops_fraction,
           "kept_flops_fraction": plan.kept_flops_fraction, "wall_s": wall,
           "runs": measured.get("runs"), "keep": [(k.module, k.op) for k in plan.keep], "notes": plan.notes,
           "predicted_after": figure_json(plan.predicted["after"]),
           "measured_after": figure_json(measured["after"]) if "after" in measured else None}
    if fp32_onnx is not None:
        try:
            blocked = onnx_nodes_to_exclude(fp32_onnx, plan.policy())
            converted = float16.convert_float_to_float16(fp32_onnx, keep_io_types=True, node_block_list=blocked)
            out["onnx_runtime_cpu"] = judge(ort_outputs(converted, feeds), reference, tol["rtol"], tol["atol"])
            out["kept_flops_fraction"] = float32_fraction(converted, flops)
            out["onnx_blocked_nodes"] = len(blocked)
        except Exception as exc:
            out["onnx_runtime_cpu"] = {"error": one_line(exc)}
    return out


def run_ort_amp(module, args, fp32_onnx, feeds, tol, flops, reference) -> Dict[str, Any]:
    from onnxconverter_common.auto_mixed_precision import auto_convert_mixed_precision

    start = time.perf_counter()
    converted = auto_convert_mixed_precision(fp32_onnx, feeds, rtol=tol["rtol"], atol=tol["atol"], keep_io_types=True)
    wall = time.perf_counter() - start
    return anchor_result(module, args, fp32_onnx, converted, feeds, tol, flops, reference, wall)


def anchor_result(module, args, fp32_onnx, converted, feeds, tol, flops, reference, wall) -> Dict[str, Any]:
    policy = anchor_policy(fp32_onnx, converted, module)
    out = {"onnx_runtime_cpu": judge(ort_outputs(converted, feeds), reference, tol["rtol"], tol["atol"]),
           "kept_flops_fraction": float32_fraction(converted, flops), "wall_s": wall, "keep": len(policy["keep"])}
    out.update(measured_in_torch(module, args, policy, tol))
    return out


def run_modelopt(module, args, fp32_onnx, feeds, tol, flops, reference) -> Dict[str, Any]:
    import logging

    import onnx
    from modelopt.onnx.autocast import convert_to_mixed_precision

    logging.getLogger("modelopt").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "model.onnx")
        onnx.save(fp32_onnx, path)
        calibration = os.path.join(tmp, "calibration.npz")
        np.savez(calibration, **feeds)
        start = time.perf_counter()
        converted = convert_to_mixed_precision(path, "fp16", keep_io_types=True, calibration_data=calibration)
        wall = time.perf_counter() - start
    return anchor_result(module, args, fp32_onnx, converted, feeds, tol, flops, reference, wall)


def anchor_policy(fp32_onnx, converted, module) -> Dict[str, Any]:
    """The ONNX nodes an anchor left in float32, as a preclint policy for the torch model: a node of
    a leaf module keeps that module, an op of a module's own forward keeps that op there. Read from
    the dynamo exporter's scope metadata."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(converted)
    types = {v.name: v.type.tensor_type.elem_type for v in
             list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output)}
    leaves = {n for n, m in module.named_modules() if not any(True for _ in m.children())}
    names = set(dict(module.named_modules()))
    keep = {}
    for node in fp32_onnx.graph.node:
        out = [o for o in node.output if o]
        if not out or types.get(out[0]) != 1:
            continue
        scopes = next((json.loads(p.value.replace("'", '"')) for p in node.metadata_props
                       if p.key == "pkg.torch.onnx.name_scopes"), None)
        if not scopes or len(scopes) < 2:
            continue
        owner, op = scopes[-2], scopes[-1]
        if owner in leaves and owner:
            keep[(owner, None)] = True
        elif owner in names:
            keep[(owner, op.rstrip("0123456789").rstrip("_").lstrip("_") or op)] = True
    return {"precision": "fp16-full", "keep": [{"module": m, "op": o} for m, o in keep]}


def measured_in_torch(module, args, policy, tol) -> Dict[str, Any]:
    """A policy applied to the torch model in float16, measured against float64 (CPU float16 kernels
    store every result in float16, as a GPU does; ORT's CPU provider computes many float16 nodes in
    float32 and would flatter every plan)."""
    from preclint.load.modelio import Inputs
    from preclint.measure.compare import Tolerance
    from preclint.plan.verify import Verifier

    verifier = Verifier(module, Inputs(tuple(args)), "fp16-full", Tolerance(tol["rtol"], tol["atol"]), "cpu")
    run = verifier.run(policy)
    return {"meets": run.meets, "rel_error": run.summary.rel_error, "finite": run.summary.finite}


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


# ---------------------------------------------------------------------------------------------- main


def bench(entry: Dict[str, Any], tools: List[str], timeout: float) -> Dict[str, Any]:
    import copy

    module, args = entry["build"]()
    module = module.eval()
    args = tuple(args)
    row: Dict[str, Any] = {"model": entry["name"], "description": entry.get("description")}
    with torch.no_grad():
        reference = flat(copy.deepcopy(module).double()(*[a.double() if torch.is_tensor(a) and a.is_floating_point() else a
                                                        for a in args]))
        fp32 = flat(module(*args))
        try:
            low = flat(copy.deepcopy(module).half()(*[a.half() if torch.is_tensor(a) and a.is_floating_point() else a
                                                      for a in args]))
        except Exception as exc:  # a constant float16 cannot hold
            low = None
            row["all_fp16_error"] = one_line(exc)
    floats = [r for r in reference if np.issubdtype(r.dtype, np.floating)]
    if not floats or not all(np.isfinite(r).all() for r in floats):
        row["skipped"] = "no finite float output to compare"
        return row
    rms = math.sqrt(sum(float((r * r).sum()) for r in floats) / max(1, sum(r.size for r in floats)))
    tol = {"rtol": RTOL, "atol": ATOL_REL * rms if rms > 0 else 1e-6}
    row["tolerance"] = tol
    row["float32"] = judge(fp32, reference, **tol)
    row["all_fp16"] = judge(low, reference, **tol) if low is not None else {"meets": False}
    row["low_precision_fails"] = not row["all_fp16"]["meets"]
    fp32_onnx = feeds = flops = None
    try:
        fp32_onnx = export(module, args)
        names = [i.name for i in fp32_onnx.graph.input]
        feeds = {n: a.numpy() for n, a in zip(names, [a for a in args if torch.is_tensor(a)])}
        flops = onnx_flops(fp32_onnx)
        row["onnx_float32"] = judge(ort_outputs(fp32_onnx, feeds), reference, **tol)
    except Exception as exc:
        row["onnx_export"] = one_line(exc)
        fp32_onnx = None
    runners = {"preclint": lambda: run_preclint(module, args, tol, fp32_onnx, feeds, flops, reference),
               "ort_auto_mixed_precision": lambda: run_ort_amp(module, args, fp32_onnx, feeds, tol, flops, reference),
               "modelopt_autocast": lambda: run_modelopt(module, args, fp32_onnx, feeds, tol, flops, reference)}
    for tool in tools:
        if tool != "preclint" and fp32_onnx is None:
            row[tool] = {"error": "the model did not export to ONNX"}
            continue
        row[tool] = isolated(runners[tool], timeout)
    return row


def isolated(fn, timeout: float) -> Dict[str, Any]:
    """``fn()`` in a forked child: an anchor that aborts the process (ONNX Runtime's C++ asserts
    during auto_convert_mixed_precision's search) or searches for too long is one row's error."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    queue = context.Queue()

    def child():
        # a forked child must not enter the OpenMP pool the parent started: it would wait forever
        torch.set_num_threads(1)
        try:
            queue.put(fn())
        except Exception as exc:
            if os.environ.get("PLAN_BENCH_DEBUG"):
                traceback.print_exc()
            queue.put({"error": one_line(exc)})

    process = context.Process(target=child)
    process.start()
    process.join(timeout)
    if process.is_alive():
        process.terminate()
        process.join()
        return {"error": f"gave up after {timeout:.0f} s"}
    try:
        return queue.get(timeout=5)
    except Exception:
        return {"error": f"the process died (exit code {process.exitcode})"}


def summarize(rows: List[Dict[str, Any]], tools: List[str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for tool in tools:
        done = [r for r in rows if tool in r and "error" not in r[tool]]
        fails = [r for r in done if r["low_precision_fails"]]
        healthy = [r for r in done if not r["low_precision_fails"]]
        meets = lambda r: r[tool].get("meets")  # noqa: E731  (measured in torch, float16 kernels)
        out[tool] = {
            "models": len(done),
            "errors": len([r for r in rows if tool in r and "error" in r[tool]]),
            "meets_where_float32_does": f"{sum(1 for r in done if r['float32']['meets'] and meets(r))}/"
                                        f"{sum(1 for r in done if r['float32']['meets'])}",
            "meets_on_failing_models": f"{sum(1 for r in fails if meets(r))}/{len(fails)}",
            "empty_or_zero_on_healthy": f"{sum(1 for r in healthy if (r[tool].get('kept_flops_fraction') or 0) == 0)}/{len(healthy)}",
            "mean_kept_flops_fraction_failing": _mean([r[tool].get("kept_flops_fraction") for r in fails]),
            "total_wall_s": round(sum(r[tool].get("wall_s", 0.0) for r in done), 2),
        }
    return out


def against_best_anchor(rows: List[Dict[str, Any]], anchors=("ort_auto_mixed_precision", "modelopt_autocast")):
    """Per model where float16 alone fails and preclint and at least one anchor meet the tolerance:
    preclint's kept fraction against the smallest an anchor that meets keeps."""
    out = []
    for r in rows:
        if "skipped" in r or not r.get("low_precision_fails") or not r.get("preclint", {}).get("meets"):
            continue
        met = [r[a]["kept_flops_fraction"] for a in anchors if a in r and r[a].get("meets")]
        if met:
            out.append({"model": r["model"], "preclint": r["preclint"]["kept_flops_fraction"], "best_anchor": min(met)})
    return out


def markdown(result: Dict[str, Any]) -> str:
    """The per-model table and the summary table of benchmarks/README.md ("Plan")."""
    tools = [("preclint", "preclint"), ("ort_auto_mixed_precision", "ORT AMP"), ("modelopt_autocast", "ModelOpt")]
    lines = ["| model | fp16 alone | float32 | " + " | ".join(f"{label}: meets / kept / s" for _, label in tools) + " |",
             "|---|---|---|---|---|---|"]
    rows = [r for r in result["models"] if "skipped" not in r]
    for r in rows:
        cells = []
        for tool, _ in tools:
            t = r.get(tool, {})
            if "error" in t:
                cells.append("error: " + ("no ONNX export" if "export" in t["error"] else t["error"].split(":")[0]))
            else:
                cells.append(f"{'yes' if t.get('meets') else 'NO'} / {t.get('kept_flops_fraction') or 0:.3f} / {t.get('wall_s', 0):.1f}")
        lines.append(f"| {r['model']} | {'fails' if r['low_precision_fails'] else 'meets'} | "
                     f"{'meets' if r['float32']['meets'] else 'fails'} | " + " | ".join(cells) + " |")
    summary = result["summary"]
    lines += ["", "| | " + " | ".join(label for _, label in tools) + " |", "|---|---|---|---|"]
    for key, label in (("meets_where_float32_does", "meets the tolerance where float32 does"),
                       ("meets_on_failing_models", "meets it where float16 alone fails"),
                       ("empty_or_zero_on_healthy", "empty plan on healthy models"),
                       ("errors", "errors"), ("total_wall_s", "wall time, all models (s)")):
        lines.append(f"| {label} | " + " | ".join(str(summary.get(t, {}).get(key, "-")) for t, _ in tools) + " |")
    best = against_best_anchor(rows)
    more = [b for b in best if b["preclint"] > b["best_anchor"] + 1e-9]
    lines += ["", f"kept fraction against the best anchor that meets, on the {len(best)} failing models where both "
                  f"meet: no larger on {len(best) - len(more)}, larger on {len(more)}"
              + "".join(f"; {b['model']}: {b['preclint']:.3f} against {b['best_anchor']:.3f}" for b in more)]
    runs = [r["preclint"].get("runs") for r in rows if "preclint" in r and r["preclint"].get("runs") is not None]
    if runs:
        lines.append(f"runs of the model with a plan (preclint): at most {max(runs)}; "
                     + ", ".join(f"{n}: {runs.count(n)} models" for n in sorted(set(runs))))
    return "\n".join(lines)


def _mean(values) -> Optional[float]:
    values = [v for v in values if v is not None]
    return round(sum(values) / len(values), 4) if values else None


def reuse_columns(rows: List[Dict[str, Any]], tools: List[str], previous: Dict[str, Any]) -> List[str]:
    """Copy into ``rows`` the columns of the tools not run now from an earlier results file (a tool not
    installed here), model by model; the tools whose columns were copied."""
    earlier = {r["model"]: r for r in previous.get("models", [])}
    copied = []
    for tool in ALL_TOOLS:
        if tool in tools:
            continue
        for row in rows:
            if tool in earlier.get(row["model"], {}):
                row[tool] = earlier[row["model"]][tool]
                copied.append(tool)
    return sorted(set(copied))


def write(path: str, rows: List[Dict[str, Any]], tools: List[str], reused: Optional[Dict[str, str]] = None) -> Dict[str, Any]:
    columns = tools + [t for t in ALL_TOOLS if t not in tools and reused and t in reused]
    result = {"machine": {"platform": platform.platform(), "torch": torch.__version__, "cpu_count": os.cpu_count()},
              "tolerance": f"rtol={RTOL}, atol={ATOL_REL} x RMS of the float64 output", "precision": "fp16-full",
              "summary": summarize([r for r in rows if "skipped" not in r], columns), "models": rows}
    if reused:
        result["reused"] = reused
    os.makedirs(os.path.dirname(path), exist_ok=True)
    result = stamp(result)
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=str)
    return result


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "plan_anchors_cpu.json"))
    parser.add_argument("--tools", default=",".join(ALL_TOOLS))
    parser.add_argument("--reuse", metavar="RESULTS",
                        help="take the columns of the tools not run from this earlier results file (a tool not installed)")
    parser.add_argument("--only", help="comma-separated substrings of model names")
    parser.add_argument("--torchvision", action="store_true", help="also resnet18, resnet50, mobilenet_v3_small at 64x64")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one tool may take on one model")
    parser.add_argument("--markdown", metavar="RESULTS", help="print the README tables of a results file and exit")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown(json.load(f)))
        return 0
    tools = args.tools.split(",")
    previous = None
    if args.reuse:
        with open(args.reuse) as f:
            previous = json.load(f)
    reused: Dict[str, str] = {}
    rows = []
    for entry in models(args.torchvision):
        if args.only and not any(s in entry["name"] for s in args.only.split(",")):
            continue
        row = bench(entry, tools, args.timeout)
        rows.append(row)
        if previous is not None:
            for tool in reuse_columns([row], tools, previous):
                reused[tool] = f"copied from {os.path.basename(args.reuse)}, not run here"
        write(args.out, rows, tools, reused)
        shown = {t: (row[t].get("error") or f"meets={row[t].get('meets')} "
                     f"kept={row[t].get('kept_flops_fraction')} wall={row[t].get('wall_s', 0):.1f}s")
                 for t in tools if t in row}
        print(row["model"], "fails-in-fp16" if row.get("low_precision_fails") else "healthy", row.get("skipped", ""), shown,
              flush=True)
    result = write(args.out, rows, tools, reused)
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
