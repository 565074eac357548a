"""Benchmark: preclint's predicted errors against errors measured by running the reduced precision.

For every model of the zoo (benchmarks/zoo.py) and every precision mode it compares

* the predicted output error (relative RMS) with the measured one,
* predicted overflow (inf/NaN) with what the run produced,
* for models whose output is a decision, the predicted flip fraction (PCL301) with the measured one,
* the layers predicted to contribute most with a one-layer-at-a-time measurement (one conv, linear
  or attention module in reduced precision, the rest in fp32).

Measuring, predicting and reporting are separate steps, so the measurement can run on a GPU machine
and the prediction here:

    python -m benchmarks.accuracy measure --device cuda --out gpu.json [--ranking]   # on the GPU
    python -m benchmarks.accuracy measure --device cpu --out cpu.json [--ranking]
    python -m benchmarks.accuracy predict --out predicted.json
    python -m benchmarks.accuracy report predicted.json cpu.json gpu.json            # markdown tables

Each mode runs as the probe runs it (preclint.measure's runners), compared with measure.compare:

| mode | cuda (NativeRunner) | cpu (EmulatedRunner, preclint/measure/modes.py) |
|---|---|---|
| tf32 | TF32 on for cuDNN and cuBLAS | operands of the convs and matmuls an H200 runs in TF32 rounded to 10 mantissa bits, fp32 accumulation |
| fp16, bf16 | torch.autocast('cuda') | CUDA autocast's op lists: listed ops round operands and parameters, fp32 accumulation |
| fp16-full, bf16-full | model and inputs cast with .to(dtype) | parameters, buffers and inputs rounded; every op in fp32, stored in the format |

The reference is the model in float64 on the same device; decisions are compared with the fp32 run
(TF32 off), whose margins preclint reads.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch

if __package__ in (None, ""):  # run as a script: make `benchmarks` and `preclint` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import stamp  # noqa: E402
from benchmarks.zoo import BY_NAME, ZOO, ZooModel, fingerprint, same_fingerprint  # noqa: E402
from preclint.reference.analyses.margins import DecisionMargins, RoundingMargins  # noqa: E402
from preclint.load.modelio import Inputs, output_tensors  # noqa: E402
from preclint.measure.compare import compare as compare_outputs  # noqa: E402
from preclint.measure.program import RunFailed  # noqa: E402
from preclint.measure.runners import capture_graph, run_mode, run_reference, runner_for  # noqa: E402

MODES = ("tf32", "fp16", "bf16", "fp16-full", "bf16-full")
RANKING_MODES = ("tf32", "fp16", "bf16")
TOP = 5
WITHIN = 3.0  # a prediction "holds" when it is within this factor of the measurement
BROKEN = 0.5  # a relative error this large is no rounding: the values were destroyed (inf divided away)

# ---------------------------------------------------------------------------------------- running
# (the modes run as the probe runs them: preclint.measure's runners, emulated on the CPU)


def ranking_units(model: torch.nn.Module) -> List[str]:
    """Module paths of the leaf convs, linears and attention modules: the layers one can put in
    reduced precision alone."""
    from preclint.capture import ops
    from preclint.core.ir import DOT_PRODUCT_KINDS

    units = []
    for path, module in model.named_modules():
        if path and ops.is_leaf_module(module) and ops.classify_module(module)[0] in DOT_PRODUCT_KINDS:
            if any(True for _ in module.parameters(recurse=False)):
                units.append(path)
    return units


def measure_ranking(model, inputs, device: str, modes: Sequence[str] = RANKING_MODES,
                    graph=None) -> Dict[str, Dict[str, float]]:
    """Per mode, per unit: relative mean-square output error with only that unit in reduced precision
    (the rest in float32; ``graph``: the model's capture, which the CPU's emulated runs follow)."""
    units = ranking_units(model)
    reference = output_tensors(run_reference(model, inputs, device, None))
    result: Dict[str, Dict[str, float]] = {}
    for mode in modes:
        runner = runner_for(mode, device)
        errors = {}
        for path in units:
            measured = compare_outputs(output_tensors(runner.output(model, inputs, graph, only=path)), reference)
            errors[path] = measured.rel_rms ** 2 if measured.rel_rms is not None else math.inf
        result[mode] = errors
    return result


def measure_model(entry: ZooModel, device: str, modes: Sequence[str] = MODES, ranking: bool = False) -> Dict[str, Any]:
    model, inputs = entry.build()
    record: Dict[str, Any] = {"name": entry.name, "family": entry.family, "fingerprint": fingerprint(model, inputs),
                              "device": device, "modes": {}}
    start = time.perf_counter()
    model = model.to(device)
    inputs = Inputs.of(inputs).map(lambda t: t.to(device))
    graph = capture_graph(model, inputs, entry.name) if device == "cpu" else None  # what the emulation follows
    reference = output_tensors(run_reference(model, inputs, device))
    fp32 = output_tensors(run_reference(model, inputs, device, None))
    floats = any(t.is_floating_point() for t in reference)
    labels = any(not t.is_floating_point() for t in reference)
    if floats:
        record["fp32_rel_error"] = compare_outputs(fp32, reference).rel_rms
    for mode in modes:
        try:
            out = output_tensors(run_mode(model, inputs, mode, device, graph=graph))
        except (RuntimeError, RunFailed) as exc:
            cause = exc.cause if isinstance(exc, RunFailed) else exc
            if not isinstance(cause, RuntimeError):
                raise
            # PyTorch refuses the mode (a constant float16 cannot hold, ...)
            record["modes"][mode] = {"finite": False, "raised": str(cause).splitlines()[0]}
            continue
        entry_out: Dict[str, Any] = {}
        if floats:
            measured = compare_outputs(out, reference)
            entry_out["finite"] = measured.finite
            entry_out["rel_error"] = measured.rel_rms
        if labels:
            decisions = compare_outputs(out, fp32)  # decisions against the float32 run, whose margins preclint reads
            entry_out["flip_fraction"] = decisions.flip_fraction
            entry_out["decisions"] = decisions.decisions
            entry_out.setdefault("finite", True)
        record["modes"][mode] = entry_out
    if ranking and entry.ranking:
        record["ranking"] = measure_ranking(model, inputs, device, graph=graph)
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def measure(entries: Iterable[ZooModel], device: str, ranking: bool, modes: Sequence[str] = MODES,
            log=print, out: Optional[str] = None, extra: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Measure each entry; with ``out``, rewrite that file after each model, so a run cut short by a
    time limit still leaves what it measured (with ``extra`` results measured before)."""
    results = {**(extra or {}), "machine": describe_machine(device), "models": {}}
    for entry in entries:
        try:
            results["models"][entry.name] = measure_model(entry, device, modes, ranking)
            log(f"measured {entry.name} on {device} in {results['models'][entry.name]['seconds']}s")
        except Exception as exc:  # one broken model must not cost the whole (GPU) run
            results["models"][entry.name] = {"name": entry.name, "error": f"{type(exc).__name__}: {exc}"}
            log(f"FAILED {entry.name}: {type(exc).__name__}: {exc}")
        if out:
            _write(out, results)
    return results


def rule_examples() -> List[ZooModel]:
    """The bad example models of the rules that predict an error, run like zoo models."""
    from preclint.rules import graph_rules

    entries = []
    for rule in graph_rules():
        if rule.code not in EXAMPLE_RULES:
            continue
        for i, example in enumerate(rule.bad):
            entries.append(ZooModel(f"{rule.code}-bad-{i}", "rule example", example.build))
    return entries


# rules whose findings carry a predicted error (or flip fraction, or overflow) to check
EXAMPLE_RULES = ("PCL101", "PCL102", "PCL104", "PCL201", "PCL202", "PCL203", "PCL204", "PCL301")


def measure_accumulation(device: str) -> Dict[str, Any]:
    """Relative error of sums, means, products and cumulative sums of float16/bfloat16 inputs against
    float64 sums of the same rounded inputs, by length: whether the kernels accumulate in the
    reduced format (error growing with the length) or in float32 (error of the final rounding only)."""
    generator = torch.Generator().manual_seed(0)
    results: Dict[str, Any] = {}
    ops = {
        "sum": lambda x: x.sum(-1), "mean": lambda x: x.mean(-1), "cumsum": lambda x: x.cumsum(-1),
        "prod": lambda x: x.prod(-1), "cumprod": lambda x: x.cumprod(-1),
    }
    with torch.no_grad():
        for n in (256, 4096, 65536, 1 << 20):
            rows = max(2, min(64, (1 << 22) // n))
            data = {
                # positive terms whose sum stays ~500 (inside float16's range at every length)
                "positive": torch.rand(rows, n, generator=generator) * (1000.0 / n),
                # signed terms whose sum is ~N(0, 100^2)
                "signed": torch.randn(rows, n, generator=generator) * (100.0 / math.sqrt(n)),
                # factors near 1 whose product stays near 1
                "factors": torch.exp(torch.randn(rows, n, generator=generator) * (0.1 / math.sqrt(n))),
            }
            for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
                for op_name, op in ops.items():
                    for data_name, x in data.items():
                        if (op_name in ("prod", "cumprod")) != (data_name == "factors"):
                            continue
                        low = x.to(dtype).to(device)
                        reference = op(low.double()).cpu()
                        value = op(low).double().cpu()
                        key = f"{op_name}/{dtype_name}/{data_name}/{n}"
                        results[key] = compare_outputs([value], [reference]).rel_rms
        ones = torch.ones(8192, dtype=torch.float16, device=device)
        results["cumsum/fp16/ones/8192 at 4097"] = float(ones.cumsum(0)[4096])
        if device == "cuda" and hasattr(torch.backends.cuda.matmul, "allow_fp16_accumulation"):
            for k in (64, 1024, 16384):
                a = torch.randn(64, k, generator=generator).to(device, torch.float16)
                b = torch.randn(k, 64, generator=generator).to(device, torch.float16)
                reference = (a.double() @ b.double()).cpu()
                for flag in (False, True):
                    torch.backends.cuda.matmul.allow_fp16_accumulation = flag
                    try:
                        results[f"matmul/fp16/accumulate_fp16={flag}/{k}"] = compare_outputs([(a @ b).cpu()], [reference]).rel_rms
                    finally:
                        torch.backends.cuda.matmul.allow_fp16_accumulation = False
    return results


def describe_machine(device: str) -> Dict[str, Any]:
    info = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform()}
    try:
        import torchvision

        info["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
        info["cudnn"] = torch.backends.cudnn.version()
    else:
        info["cpu"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
        info["cores"] = os.cpu_count()
    return info


# ------------------------------------------------------------------------------------- predicting


def predict_model(entry: ZooModel, modes: Sequence[str] = MODES) -> Dict[str, Any]:
    from preclint.config import Config
    from preclint.engine import CheckOptions, check_model
    from preclint.core.ir import DOT_PRODUCT_KINDS
    from preclint.load.loader import LoadedModel

    model, inputs = entry.build()
    start = time.perf_counter()
    loaded = LoadedModel(model.eval(), inputs, entry.name, None)
    report, graph, ctx = check_model(loaded, Config(precisions=tuple(modes)), CheckOptions(modes=tuple(modes)))
    record: Dict[str, Any] = {"name": entry.name, "fingerprint": fingerprint(model, inputs), "modes": {},
                              "findings": sorted({f.code for f in report.findings})}
    units = set(ranking_units(model))
    decision_nodes = _output_decisions(graph)
    record["finding_figures"] = [
        {"code": f.code, "severity": f.severity, "precisions": list(f.precisions),
         "predicted": {m: fig.as_dict() for m, fig in f.predicted.items()}}
        for f in report.findings
    ]
    for mode in modes:
        p = ctx.predictions[mode]
        contributions = {}
        for name, share in p.contributions.items():
            node = graph[name]
            if node.kind in DOT_PRODUCT_KINDS and node.module_path in units:
                contributions[node.module_path] = contributions.get(node.module_path, 0.0) + share
        flips = [p.nodes[n.name].flip_fraction for n in decision_nodes if p.nodes[n.name].flip_fraction is not None]
        record["modes"][mode] = {
            "rel_error": p.rel_error,
            "finite": p.finite,
            "top": [ctx.display(n) for n, _ in p.top_contributors(TOP)],
            "unit_shares": contributions,
            "flip_fraction": max(flips) if flips else None,
            "findings": sorted({f.code for f in report.findings if mode in f.precisions}),
        }
    record["seconds"] = round(time.perf_counter() - start, 2)
    return record


def _output_decisions(graph) -> List[Any]:
    """The decisions and roundings to integers whose outcome is the model's output: walked back from
    the outputs through integer values (indices, labels, codes) to the op that decided them."""
    found, seen = [], set()
    frontier = [n for out in graph.output_nodes for n in out.inputs]
    while frontier:
        name = frontier.pop()
        node = graph.get(name)
        if node is None or name in seen:
            continue
        seen.add(name)
        if node.record(DecisionMargins) is not None or node.record(RoundingMargins) is not None:
            found.append(node)
            if node.out is not None and node.out.is_float:
                continue  # round/floor: the decision was taken here
        if node.out is not None and not node.out.is_float:
            frontier.extend(node.inputs)
    return found


def predict_all(entries: Iterable[ZooModel], modes: Sequence[str] = MODES, log=print) -> Dict[str, Any]:
    results = {"machine": describe_machine("cpu"), "models": {}}
    for entry in entries:
        try:
            results["models"][entry.name] = predict_model(entry, modes)
            log(f"predicted {entry.name} in {results['models'][entry.name]['seconds']}s")
        except Exception as exc:
            results["models"][entry.name] = {"name": entry.name, "error": f"{type(exc).__name__}: {exc}"}
            log(f"FAILED {entry.name}: {type(exc).__name__}: {exc}")
    return results


# -------------------------------------------------------------------------------------- comparing


FP32_U = 2.0**-24


def within(predicted: Optional[float], measured: Optional[float], factor: float = WITHIN, floor: float = FP32_U) -> bool:
    """Whether the prediction is within ``factor`` of the measurement. Errors below ``floor`` (what the
    fp32 run itself differs from float64 by) cannot be told apart, so both are raised to it."""
    if predicted is None or measured is None:
        return False
    predicted, measured = max(predicted, floor), max(measured, floor)
    return 1.0 / factor <= predicted / measured <= factor


def top_overlap(predicted: Dict[str, float], measured: Dict[str, float], n: int = TOP) -> Tuple[int, List[str], List[str]]:
    top_p = [k for k, _ in sorted(predicted.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
    top_m = [k for k, _ in sorted(measured.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
    return len(set(top_p) & set(top_m)), top_p, top_m


def compare(predicted: Dict[str, Any], measured: Dict[str, Any]) -> Dict[str, Any]:
    """Agreement figures of one measurement file against the predictions."""
    pairs, overflow, flips, ranking, mismatched = [], [], [], [], []
    for name, m in measured["models"].items():
        p = predicted["models"].get(name)
        if p is None or "error" in m or "error" in p:
            continue
        if not same_fingerprint(m["fingerprint"], p["fingerprint"]):
            mismatched.append(name)
            continue
        for mode, mm in m["modes"].items():
            pm = p["modes"].get(mode)
            if pm is None:
                continue
            if "raised" in mm:
                overflow.append((name, mode, not pm["finite"], True))
                continue
            if "rel_error" in mm:
                # an overflow whose inf is divided away shows as zeros, not inf: destroyed values
                # (an error as large as the values) are the same outcome
                broken = not mm["finite"] or (not pm["finite"] and mm["rel_error"] >= BROKEN)
                overflow.append((name, mode, not pm["finite"], broken))
                if broken:
                    continue
                floor = max(FP32_U, m.get("fp32_rel_error") or 0.0)
                if mm["finite"] and pm["rel_error"] is not None:
                    pairs.append((name, mode, pm["rel_error"], mm["rel_error"],
                                  within(pm["rel_error"], mm["rel_error"], floor=floor)))
                elif mm["finite"]:
                    pairs.append((name, mode, None, mm["rel_error"], False))
            if "flip_fraction" in mm:
                flips.append((name, mode, pm.get("flip_fraction"), mm["flip_fraction"], mm.get("decisions")))
        for mode, errors in (m.get("ranking") or {}).items():
            finite = {k: v for k, v in errors.items() if math.isfinite(v)}
            hits, top_p, top_m = top_overlap(p["modes"][mode]["unit_shares"], finite)
            ranking.append((name, mode, hits, top_p, top_m))
    measured_nonfinite = [o for o in overflow if o[3]]
    caught = [o for o in measured_nonfinite if o[2]]
    false_alarms = [o for o in overflow if o[2] and not o[3]]
    examples = {n for n, m in measured["models"].items() if m.get("family") == "rule example"}
    zoo_pairs = [p for p in pairs if p[0] not in examples]
    summary = {
        "pairs": len(pairs),
        "within": sum(1 for p in pairs if p[4]),
        "within_fraction": (sum(1 for p in pairs if p[4]) / len(pairs)) if pairs else None,
        "zoo_pairs": len(zoo_pairs),
        "zoo_within": sum(1 for p in zoo_pairs if p[4]),
        "nonfinite_measured": len(measured_nonfinite),
        "nonfinite_predicted": len(caught),
        "false_alarms": len(false_alarms),
        "ranking_mean_hits": {mode: statistics.mean(r[2] for r in ranking if r[1] == mode)
                              for mode in sorted({r[1] for r in ranking})},
        "fingerprint_mismatch": mismatched,
    }
    return {"summary": summary, "pairs": pairs, "overflow": overflow, "flips": flips, "ranking": ranking}


def _sci(v: Optional[float]) -> str:
    if v is None:
        return "—"
    if v == 0:
        return "0"
    return f"{v:.2e}"


def report(predicted: Dict[str, Any], measurements: Sequence[Dict[str, Any]], details: bool = False) -> str:
    lines: List[str] = []
    for measured in measurements:
        machine = measured["machine"]
        where = machine.get("gpu") or f"CPU ({machine.get('cpu')}, {machine.get('threads')} threads)"
        result = compare(predicted, measured)
        s = result["summary"]
        lines.append(f"### Measured on {where}, torch {machine['torch']}"
                     + (f", CUDA {machine['cuda']}, cuDNN {machine['cudnn']}" if "cuda" in machine else ""))
        lines.append("")
        lines.append(f"- predicted output error within {WITHIN:g}x of measured: **{s['within']}/{s['pairs']}** "
                     f"(model, mode) pairs = **{100 * (s['within_fraction'] or 0):.0f}%**; the zoo alone "
                     f"{s['zoo_within']}/{s['zoo_pairs']} = {100 * s['zoo_within'] / max(1, s['zoo_pairs']):.0f}%, "
                     f"the rules' example models {s['within'] - s['zoo_within']}/{s['pairs'] - s['zoo_pairs']}")
        lines.append(f"- inf/NaN outputs predicted: **{s['nonfinite_predicted']}/{s['nonfinite_measured']}**, "
                     f"false alarms: **{s['false_alarms']}**")
        if s["ranking_mean_hits"]:
            hits = ", ".join(f"{mode} {v:.1f}" for mode, v in s["ranking_mean_hits"].items())
            lines.append(f"- contribution ranking, measured top-{TOP} layers found in the predicted top-{TOP} "
                         f"(mean over models): {hits}")
        if s["fingerprint_mismatch"]:
            lines.append(f"- not compared (the weights built there differ from here): {', '.join(s['fingerprint_mismatch'])}")
        lines.append("")
        modes = [m for m in MODES if any(p[1] == m for p in result["pairs"]) or any(o[1] == m for o in result["overflow"])]
        lines.append("| model | " + " | ".join(modes) + " |")
        lines.append("|---|" + "---|" * len(modes))
        cells: Dict[Tuple[str, str], str] = {}
        for name, mode, pred, meas, ok in result["pairs"]:
            ratio = f" ({pred / meas:.2f}x)" if pred and meas else ""
            cells[(name, mode)] = f"{_sci(pred)} / {_sci(meas)}{ratio}{'' if ok else ' ✗'}"
        for name, mode, pred_nf, meas_nf in result["overflow"]:
            if meas_nf or pred_nf:
                cells[(name, mode)] = ("inf/NaN predicted / measured" if pred_nf and meas_nf else
                                       "inf/NaN measured, not predicted ✗" if meas_nf else
                                       "inf/NaN predicted, finite measured ✗")
        for name in measured["models"]:
            if any((name, m) in cells for m in modes):
                lines.append(f"| {name} | " + " | ".join(cells.get((name, m), "—") for m in modes) + " |")
        lines.append("")
        lines.append("Cells: predicted / measured relative RMS error of the output (ratio); ✗ outside "
                     f"{WITHIN:g}x.")
        lines.append("")
        if result["flips"]:
            lines.append("Decision flips (PCL301), predicted / measured fraction of decisions that change:")
            lines.append("")
            lines.append("| model | mode | decisions | predicted | measured |")
            lines.append("|---|---|---|---|---|")
            quiet = []
            for name, mode, pred, meas, units in result["flips"]:
                if (pred or 0.0) < 1.0 / max(units or 1, 1) / 100 and not meas:
                    quiet.append(f"{name} ({mode})")  # no flip predicted (< 0.01 expected) and none measured
                    continue
                lines.append(f"| {name} | {mode} | {units} | {_sci(pred)} | {_sci(meas)} |")
            lines.append("")
            if quiet:
                lines.append(f"No flip predicted (fewer than 0.01 expected) and none measured: {', '.join(quiet)}.")
                lines.append("")
        if result["ranking"]:
            lines.extend(_ranking_table(result["ranking"], details))
    return "\n".join(lines)


def _ranking_table(ranking, details: bool) -> List[str]:
    """Per model and mode, how many of the measured top layers the predicted top holds."""
    lines = [f"One layer at a time: of the {TOP} layers measured to contribute most, how many are among the "
             f"{TOP} predicted to:", ""]
    modes = [m for m in RANKING_MODES if any(r[1] == m for r in ranking)]
    hits = {(r[0], r[1]): r[2] for r in ranking}
    models = list(dict.fromkeys(r[0] for r in ranking))
    lines.append("| model | " + " | ".join(modes) + " | mean |")
    lines.append("|---|" + "---|" * (len(modes) + 1))
    for name in models:
        row = [hits.get((name, m)) for m in modes]
        known = [h for h in row if h is not None]
        lines.append(f"| {name} | " + " | ".join("—" if h is None else f"{h}/{TOP}" for h in row)
                     + f" | {statistics.mean(known):.1f} |")
    means = [statistics.mean(hits[(n, m)] for n in models if (n, m) in hits) for m in modes]
    lines.append("| **mean** | " + " | ".join(f"**{v:.1f}**" for v in means)
                 + f" | **{statistics.mean(hits.values()):.1f}** |")
    lines.append("")
    if details:
        lines.append("| model | mode | predicted top | measured top |")
        lines.append("|---|---|---|---|")
        for name, mode, _, top_p, top_m in ranking:
            lines.append(f"| {name} | {mode} | {', '.join(top_p)} | {', '.join(top_m)} |")
        lines.append("")
    return lines


# ------------------------------------------------------------------------------------------- main


def _entries(names: Optional[Sequence[str]]) -> List[ZooModel]:
    if names is None:
        return list(ZOO)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown zoo models: {', '.join(unknown)} (known: {', '.join(BY_NAME)})")
    return [BY_NAME[n] for n in names]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.accuracy", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="run the zoo in every mode and record the output errors")
    m.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    m.add_argument("--ranking", action="store_true", help="also measure one layer at a time")
    m.add_argument("--models", nargs="*")
    m.add_argument("--examples", action="store_true", help="also the rules' bad example models")
    m.add_argument("--accumulation", action="store_true", help="also reductions and scans by length")
    m.add_argument("--out", required=True)
    p = sub.add_parser("predict", help="run preclint on the zoo and record its predictions")
    p.add_argument("--models", nargs="*")
    p.add_argument("--examples", action="store_true", help="also the rules' bad example models")
    p.add_argument("--out", required=True)
    g = sub.add_parser("merge", help="one measurement file from several runs on one machine (later ones win)")
    g.add_argument("out")
    g.add_argument("inputs", nargs="+")
    r = sub.add_parser("report", help="markdown tables: predictions against measurements")
    r.add_argument("predicted")
    r.add_argument("measured", nargs="+")
    r.add_argument("--details", action="store_true", help="name the top layers of each ranking")
    args = parser.parse_args(argv)

    if args.command == "measure":
        torch.backends.cudnn.benchmark = False
        entries = _entries(args.models) + (rule_examples() if args.examples else [])
        extra = {}
        if args.accumulation:  # first: it takes seconds, and the reduction rule stands on it
            extra["accumulation"] = measure_accumulation(args.device)
        _write(args.out, measure(entries, args.device, args.ranking, out=args.out, extra=extra))
    elif args.command == "predict":
        entries = _entries(args.models) + (rule_examples() if args.examples else [])
        _write(args.out, predict_all(entries))
    elif args.command == "merge":
        merged: Dict[str, Any] = {"models": {}, "merged_runs": []}
        for path in args.inputs:
            with open(path) as f:
                part = json.load(f)
            # the measuring runs' provenance (stamp adds the merge's own)
            merged["merged_runs"] += part.pop("merged_runs", []) + [part.pop("provenance", None)]
            models = part.pop("models", {})
            merged.update(part)
            merged["models"].update(models)
        _write(args.out, merged)
    else:
        with open(args.predicted) as f:
            predicted = json.load(f)
        measurements = []
        for path in args.measured:
            with open(path) as f:
                measurements.append(json.load(f))
        print(report(predicted, measurements, details=args.details))
    return 0


def _write(path: str, data: Dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(stamp(data), f, indent=1, sort_keys=True)


if __name__ == "__main__":
    sys.exit(main())
