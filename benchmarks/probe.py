"""Benchmark: the probe's speed, its contributions against one-layer-at-a-time runs, and emulation
against real GPU arithmetic.

    python benchmarks/probe.py speed --device cuda --model resnet50 --batch 32 [--ablate] --out speed.json
    python benchmarks/probe.py speed --device cpu --model resnet18 --batch 1 --out cpu_speed.json
    python benchmarks/probe.py speed --device cpu --model resnet50 --batch 1 --threads 1 --repeats 2 --out r50.json
    python benchmarks/probe.py agree --models resnet18,vit_b_16 --out agree.json   # GPU machine
    python benchmarks/probe.py report speed.json cpu_speed.json agree.json         # markdown tables

``speed`` times one float32 forward pass (TF32 off, no autograd, median of 10 after warm-up) and
the probe of three modes (local, received and contribution for every node), warm: the second of two
probe runs, so that CUDA's context, cuDNN's heuristics and the allocator are set up as in any
process that has run the model once. A third run waits for the device at the end of each stage and
gives the time of each (``stages``). The static check that the probe extends is timed apart.

The bare work (``bare_work``), timed beside each warm probe run: the model brought to the device, a
float64 copy made and run, and per mode its copy made and run once as the probe runs it (natively
on a GPU, emulated op by op on the CPU), nothing observed, no autograd. ``probe_over_bare`` is the
issue's ratio (target: at most 4), and ``stage_shares`` each stage's share and its time over the
bare work. On the CPU the same figures in CPU seconds of the process (``*_cpu``): on a shared host
they move far less than wall time; ``--threads`` fixes torch's thread count.

``agree`` probes each model of the zoo (benchmarks/zoo.py) natively on the GPU and emulated (on the
GPU's own float32 units: emulation is device-independent arithmetic, checked against the CPU by the
tests) and compares, per mode, the output error, every layer's local error and the contributions.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Optional

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from preclint.config import Config  # noqa: E402
from preclint.engine import CheckOptions, check_model  # noqa: E402
from preclint.load.loader import LoadedModel  # noqa: E402
from preclint.probe import ProbeOptions, measure_model  # noqa: E402
from benchmarks.accuracy import describe_machine as machine  # noqa: E402
from benchmarks.provenance import stamp  # noqa: E402

MODES = ("tf32", "fp16", "bf16")
FP32_FLOOR = 2.0 ** -17.5  # below this a local error is float32's, not the mode's (probe/readback.py)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def forward_time(model, inputs, device: str, repeats: int = 10) -> float:
    """Median seconds of one float32 forward pass, TF32 off, without autograd."""
    from preclint.measure.backends import tf32

    model = model.to(device)
    args = tuple(x.to(device) for x in inputs)
    times = []
    with torch.no_grad(), tf32(False):
        for i in range(repeats + 3):
            _sync(device)
            start = time.perf_counter()
            model(*args)
            _sync(device)
            if i >= 3:
                times.append(time.perf_counter() - start)
    return statistics.median(times)


class StageSeconds:
    """A progress bar (preclint.core.progress.Bar's interface) that keeps the CPU seconds of each
    stage the probe describes: on a shared host the process's CPU time moves far less than the wall
    time with the other processes' load."""

    def __init__(self) -> None:
        self.seconds: Dict[str, float] = {}
        self._open: Optional[tuple] = None

    def set_total(self, total) -> None:
        pass

    def describe(self, description: str) -> None:
        self._open = (description.replace("probe: ", "", 1), time.process_time())

    def advance(self, amount: float = 1.0) -> None:
        if self._open is not None:  # (a stage the probe skipped advances without a description)
            stage, start = self._open
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.process_time() - start
        self._open = None


def timed(fn):
    """(fn's result, wall seconds, CPU seconds of the process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def bare_work(model, inputs, graph, device: str, modes=MODES) -> Dict[str, float]:
    """Seconds of the work any probe of ``modes`` must do, nothing observed: the float32 model and
    inputs brought to the device, a float64 copy made there and run once, and per mode its copy
    made and run once as the probe runs the mode (measure/runners.py: natively on a GPU, emulated
    op by op on the CPU, as the CPU probe does), without autograd. ``total`` is their sum."""
    from preclint.measure.backends import tf32
    from preclint.measure.copies import copy_to
    from preclint.measure.runners import runner_for

    dev = torch.device(device)
    out: Dict[str, float] = {}
    with torch.no_grad():
        _sync(device)
        start = time.perf_counter()
        model32 = copy_to(model, dev)
        inputs32 = tuple(x.to(dev) for x in inputs)
        _sync(device)
        out["transfer"] = time.perf_counter() - start
        start = time.perf_counter()
        model64 = copy_to(model32, dev, torch.float64)
        with tf32(False):
            model64(*(x.to(torch.float64) if x.is_floating_point() else x for x in inputs32))
        _sync(device)
        out["forward_float64"] = time.perf_counter() - start
        del model64
        for mode in modes:
            runner = runner_for(mode, dev)
            start = time.perf_counter()
            runner.run(runner.prepare(model32, inputs32, graph), graph)
            _sync(device)
            out[f"forward_{mode}"] = time.perf_counter() - start
    out["total"] = sum(out.values())
    return out


def stage_shares(stages: Dict[str, float], bare: float) -> Dict[str, Dict[str, float]]:
    """Each stage's seconds, its share of all stages and its time over the bare work's."""
    whole = sum(stages.values()) or 1.0
    return {k: {"seconds": round(v, 4), "share": round(v / whole, 4), "over_bare": round(v / bare, 4)}
            for k, v in stages.items()}


def _check(model, inputs, name: str, modes=MODES):
    loaded = LoadedModel(model.eval(), tuple(inputs), name, None)
    return check_model(loaded, Config(precisions=tuple(modes)), CheckOptions(modes=tuple(modes)))


def speed(args) -> Dict[str, Any]:
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, args.model)(weights=None).eval()
    inputs = (torch.rand(args.batch, 3, 224, 224),)
    record: Dict[str, Any] = {"model": args.model, "batch": args.batch, "device": args.device,
                              "machine": machine(args.device), "modes": list(MODES)}
    start = time.perf_counter()
    _report, graph, _ctx = _check(model, inputs, args.model)
    record["check_seconds"] = time.perf_counter() - start
    record["forward_fp32_seconds"] = forward_time(_copy(model), inputs, args.device)
    runs, bare_runs, cpu_pairs = [], [], []
    for i in range(1 + args.repeats):
        result, wall, cpu = timed(lambda: measure_model(model, inputs, graph, MODES, ProbeOptions(device=args.device)))
        runs.append((wall, result))
        if i:  # the bare work beside each warm probe run: a host whose speed drifts moves both alike
            bare, _, bare_cpu = timed(lambda: bare_work(model, inputs, graph, args.device))
            bare_runs.append(bare)
            cpu_pairs.append((cpu, bare_cpu))
    warm = [t for t, _ in runs[1:]]
    result = runs[-1][1]
    total = statistics.median(warm)
    record["probe_seconds"] = total  # the median of the warm runs: the host's speed varies from run to run
    record["probe_seconds_warm_runs"] = warm
    record["probe_seconds_first_run"] = runs[0][0]
    # the stages: a third run that waits for the device at each stage's end (slower than the runs
    # above, in which the device works on while Python issues the next stage)
    stage_cpu = StageSeconds()
    start = time.perf_counter()
    staged = measure_model(model, inputs, graph, MODES, ProbeOptions(device=args.device, sync_stages=True, bar=stage_cpu))
    record["probe_seconds_stages_synchronized"] = time.perf_counter() - start
    record["stages"] = {k: round(v, 4) for k, v in staged.timings.items()}
    record["probe_over_forward"] = total / record["forward_fp32_seconds"]
    bare_runs = bare_runs or [bare_work(model, inputs, graph, args.device)]
    bare = statistics.median(b["total"] for b in bare_runs)
    record["bare_seconds"] = bare  # the median of the runs beside the warm probe runs
    record["bare_runs"] = bare_runs
    record["bare"] = {k: statistics.median(b[k] for b in bare_runs) for k in bare_runs[0]}
    record["probe_over_bare"] = total / bare
    # each warm probe run over the bare work run after it, and their median: the target's ratio
    record["probe_over_bare_runs"] = [t / b["total"] for t, b in zip(warm, bare_runs)]
    record["probe_over_bare_median"] = statistics.median(record["probe_over_bare_runs"])
    record["stage_shares"] = stage_shares(staged.timings, bare)
    if args.device == "cpu" and cpu_pairs:
        # the same in CPU seconds of the process (what a loaded host distorts least): the probe's,
        # the bare work's, their ratio (median over the pairs) and each stage's
        record["probe_cpu_seconds"] = statistics.median(p for p, _ in cpu_pairs)
        record["bare_cpu_seconds"] = statistics.median(b for _, b in cpu_pairs)
        record["probe_over_bare_cpu"] = statistics.median(p / b for p, b in cpu_pairs)
        record["stage_shares_cpu"] = stage_shares(stage_cpu.seconds, record["bare_cpu_seconds"])
    record["emulated"] = result.environment["emulated"]
    record["output_rel_error"] = {m: result.modes[m].output.rel_error if result.modes[m].output else None for m in MODES}
    record["errors"] = {m: result.modes[m].error for m in MODES if result.modes[m].error}
    record["observer_delta"] = {m: result.modes[m].observer_delta for m in MODES}
    record["explained"] = {m: result.modes[m].explained for m in MODES}
    record["tf32_not_applied"] = [n for n, m in result.modes["tf32"].nodes.items() if m.tf32_applied is False]
    # every node's figures as printed, for `python benchmarks/large_models.py --compare A B`
    record["ledger"] = ledger_digest(result)
    if args.device == "cuda":
        record["floor"] = floor(model, inputs, graph, args.device)
    _write(args.out, record)  # before the ablation, which may be cut short
    if args.ablate:
        start = time.perf_counter()
        ablated = measure_model(model, inputs, graph, MODES, ProbeOptions(device=args.device, ablate=True))
        record["probe_with_ablation_seconds"] = time.perf_counter() - start
        record["ablation_seconds"] = sum(v for k, v in ablated.timings.items() if k.endswith("ablation"))
        record["ablation_over_forward"] = record["ablation_seconds"] / record["forward_fp32_seconds"]
        record["agreement"] = {m: ablated.modes[m].agreement for m in MODES}
    return record


def floor(model, inputs, graph, device: str) -> Dict[str, Any]:
    """The least device time any probe of these three modes needs, from its parts measured alone.

    What the probe must do, whatever its implementation: bring the model to the device; run it in
    float64; per mode run it in the mode (received) and replay every node in the mode on reference
    inputs (local: at least the same arithmetic again); one backward pass per mode for the
    contributions (bfloat16, as the probe's); and compare every node's value with the reference
    twice per mode (received, local), each a difference and its two norms over all node values.
    Times are medians of 10 on an idle device, without Python between kernels beyond the model's own.
    """
    from preclint.measure.backends import tf32
    from preclint.measure.copies import to_device

    def timed(fn, repeats: int = 10) -> float:
        times = []
        for i in range(repeats + 2):
            _sync(device)
            start = time.perf_counter()
            fn()
            _sync(device)
            if i >= 2:
                times.append(time.perf_counter() - start)
        return statistics.median(times)

    tensors = list(model.parameters()) + list(model.buffers()) + list(inputs)
    out: Dict[str, Any] = {"transfer": timed(lambda: [to_device(t, torch.device(device)) for t in tensors], 5)}
    m32 = _copy(model).to(device)
    m64 = _copy(model).to(device, torch.float64)
    x32 = tuple(x.to(device) for x in inputs)
    x64 = tuple(x.to(torch.float64) for x in x32)
    with torch.no_grad():
        out["forward_float64"] = timed(lambda: m64(*x64))
        with tf32(True):
            out["forward_tf32"] = timed(lambda: m32(*x32))
        with tf32(False):
            for name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
                with torch.autocast(device, dtype=dtype):
                    out[f"forward_{name}"] = timed(lambda: m32(*x32))
    for p in m32.parameters():
        p.requires_grad_(False)
    xg = tuple(x.clone().requires_grad_(True) for x in x32)

    def forward_backward():
        with torch.autocast(device, dtype=torch.bfloat16):
            y = m32(*xg)
        torch.autograd.grad(y, xg, torch.ones_like(y))

    out["backward_bf16"] = max(timed(forward_backward) - out["forward_bf16"], 0.0)
    elements = sum(n.out.numel for n in graph.nodes if n.out is not None and n.out.numel)
    ref = torch.randn(elements, device=device)
    value = ref.to(torch.bfloat16)
    diff = torch.empty(elements, dtype=torch.bfloat16, device=device)

    def compare():
        torch.sub(value, ref, out=diff)
        torch._foreach_norm([diff], 2, dtype=torch.float32)
        torch._foreach_norm([diff], float("inf"), dtype=torch.float32)

    out["node_values"] = elements
    out["compare_all_values"] = timed(compare)
    ref = value = diff = None  # the comparison's buffers, freed before the next measurement
    modes = ("tf32", "fp16", "bf16")
    out["total"] = (out["transfer"] + out["forward_float64"]
                    + sum(2 * out[f"forward_{m}"] + out["backward_bf16"] + 2 * out["compare_all_values"] for m in modes))
    return out


def ledger_digest(result) -> Dict[str, Dict[str, list]]:
    from benchmarks.large_models import digest

    return digest(result)


def _write(path: Optional[str], record: Dict[str, Any]) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(stamp(record), fh, indent=1, default=str)


def _copy(model):
    import copy

    return copy.deepcopy(model)


# ------------------------------------------------------------------------------------- agreement


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return None
    return a / b


def compare(graph, native, emulated) -> Dict[str, Any]:
    """Per mode: output error native vs emulated, local errors layer by layer, top contributors."""
    out: Dict[str, Any] = {}
    for mode in native.modes:
        n, e = native.modes[mode], emulated.modes[mode]
        entry: Dict[str, Any] = {"native_error": n.error, "emulated_error": e.error}
        if n.error or e.error:
            out[mode] = entry
            continue
        entry["native_output"] = n.output.rel_error if n.output else None
        entry["emulated_output"] = e.output.rel_error if e.output else None
        entry["output_ratio"] = _ratio(entry["emulated_output"], entry["native_output"])
        entry["native_finite"], entry["emulated_finite"] = n.output_finite, e.output_finite
        ratios = []
        for name, nm in n.nodes.items():
            em = e.nodes.get(name)
            if em is None or nm.local is None or em.local is None:
                continue
            a, b = nm.local.rel_error, em.local.rel_error
            if a is not None and b is not None and max(a, b) > FP32_FLOOR:
                ratios.append((name, _ratio(b, a) if a else math.inf))
        finite = [r for _, r in ratios if r is not None and math.isfinite(r)]
        entry["layers"] = len(ratios)
        entry["layers_within_2x"] = sum(1 for r in finite if 0.5 <= r <= 2.0) / len(ratios) if ratios else None
        entry["layer_ratio_median"] = statistics.median(finite) if finite else None
        entry["layers_off_2x"] = [(name, r) for name, r in ratios if r is None or not (0.5 <= r <= 2.0)][:12]
        entry["dot_layers"] = [
            (name, nm.local.rel_error if nm.local else None,
             e.nodes[name].local.rel_error if name in e.nodes and e.nodes[name].local else None, nm.tf32_applied)
            for name, nm in n.nodes.items() if graph.get(name) is not None and graph[name].kind in ("conv", "linear", "matmul")]
        if mode == "tf32":
            entry["tf32_not_applied"] = [name for name, m in n.nodes.items() if m.tf32_applied is False]
            entry["tf32_applied"] = sum(1 for m in n.nodes.values() if m.tf32_applied)
        top_n = [k for k, _ in sorted(((k, m.contribution) for k, m in n.nodes.items() if m.contribution is not None),
                                      key=lambda kv: -kv[1])[:5]]
        top_e = [k for k, _ in sorted(((k, m.contribution) for k, m in e.nodes.items() if m.contribution is not None),
                                      key=lambda kv: -kv[1])[:5]]
        entry["top5_native"], entry["top5_emulated"] = top_n, top_e
        entry["top5_overlap"] = len(set(top_n) & set(top_e)) / 5 if top_n else None
        entry["observer_delta"] = n.observer_delta
        entry["explained"] = {"native": n.explained, "emulated": e.explained}
        out[mode] = entry
    return out


def agree(args) -> Dict[str, Any]:
    from benchmarks.zoo import BY_NAME

    names = args.models.split(",")
    modes = tuple(args.modes.split(","))
    results: Dict[str, Any] = {"machine": machine("cuda"), "modes": list(modes), "models": {}}
    for name in names:
        entry = BY_NAME[name]
        start = time.perf_counter()
        try:
            model, inputs = entry.build()
            _r, graph, _c = _check(model, inputs, name, modes)
            t0 = time.perf_counter()
            native = measure_model(model, inputs, graph, modes, ProbeOptions(device="cuda"))
            t1 = time.perf_counter()
            emulated = measure_model(model, inputs, graph, modes, ProbeOptions(device="cuda", emulate=True))
            t2 = time.perf_counter()
            record = {"capture": graph.capture, "modes": compare(graph, native, emulated),
                      "probe_seconds": {"native": t1 - t0, "emulated": t2 - t1}}
            if args.cpu and name in args.cpu.split(","):
                on_cpu = measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu"))
                record["cpu_vs_gpu_emulation"] = {
                    m: _ratio(on_cpu.modes[m].output.rel_error, emulated.modes[m].output.rel_error)
                    for m in modes if on_cpu.modes[m].output and emulated.modes[m].output}
        except Exception as exc:  # one model must not cost the whole GPU run
            record = {"error": f"{type(exc).__name__}: {exc}"}
        record["seconds"] = round(time.perf_counter() - start, 2)
        results["models"][name] = record
        print(f"{name}: {record.get('error') or 'ok'} in {record['seconds']}s", flush=True)
        if args.out:
            with open(args.out, "w") as fh:
                json.dump(stamp(results), fh, indent=1, default=str)
    return results


# ---------------------------------------------------------------------------------------- report


def _sci(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float) and not math.isfinite(v):
        return "inf"
    return f"{v:.3g}"


def report(paths: List[str]) -> str:
    lines = []
    docs = []
    for path in paths:
        with open(path) as fh:
            doc = json.load(fh)
        docs += list(doc["speed"].values()) if "speed" in doc else [doc]
    for doc in docs:
        if "probe_seconds" in doc:
            m = doc["machine"]
            where = m.get("gpu") or f"{m.get('cpu')} ({m.get('threads')} threads)"
            lines.append(f"**{doc['model']}, batch {doc['batch']}, {doc['device']}** ({where}, torch {m['torch']}"
                         + (f", CUDA {m['cuda']}, cuDNN {m['cudnn']}" if "cuda" in m else "") + ")")
            lines.append("")
            lines.append("| figure | seconds | x fp32 forward |")
            lines.append("|---|---|---|")
            fwd = doc["forward_fp32_seconds"]
            lines.append(f"| fp32 forward (TF32 off) | {fwd:.4f} | 1 |")
            lines.append(f"| probe, 3 modes (warm, median) | {doc['probe_seconds']:.3f} | {doc['probe_seconds'] / fwd:.1f} |")
            if doc.get("probe_seconds_warm_runs"):
                fastest = min(doc["probe_seconds_warm_runs"])
                lines.append(f"| probe, 3 modes (warm, fastest) | {fastest:.3f} | {fastest / fwd:.1f} |")
            lines.append(f"| probe, first run in the process | {doc['probe_seconds_first_run']:.3f} | "
                         f"{doc['probe_seconds_first_run'] / fwd:.1f} |")
            if "ablation_seconds" in doc:
                lines.append(f"| one-layer-at-a-time ablation, 3 modes | {doc['ablation_seconds']:.3f} | "
                             f"{doc['ablation_seconds'] / fwd:.1f} |")
            if doc.get("floor"):
                f = doc["floor"]
                lines.append(f"| least device time of any such probe (`floor`) | {f['total']:.3f} | {f['total'] / fwd:.1f} |")
            if "bare_seconds" in doc:
                lines.append(f"| bare work: float64 + one forward per mode, nothing observed | {doc['bare_seconds']:.3f} | "
                             f"{doc['bare_seconds'] / fwd:.1f} |")
            lines.append(f"| static check (`preclint check`, CPU) | {doc['check_seconds']:.2f} | |")
            lines.append("")
            if "probe_over_bare" in doc:
                cpu = (f"; in CPU seconds {doc['probe_cpu_seconds']:.2f} / {doc['bare_cpu_seconds']:.2f} = "
                       f"{doc['probe_over_bare_cpu']:.2f}x") if "probe_over_bare_cpu" in doc else ""
                lines.append(f"Probe over bare work: {doc.get('probe_over_bare_median', doc['probe_over_bare']):.2f}x (wall, median of the pairs){cpu}")
                lines.append("")
            shares = doc.get("stage_shares_cpu") or doc.get("stage_shares")
            if shares:
                lines.append("| stage | seconds | share | x bare |")
                lines.append("|---|---|---|---|")
                for k, v in shares.items():
                    if v["share"] >= 0.005:
                        lines.append(f"| {k} | {v['seconds']:.3f} | {v['share']:.0%} | {v['over_bare']:.2f} |")
                lines.append("")
            else:
                lines.append("Stages: " + ", ".join(f"{k} {v:.3f}s" for k, v in doc["stages"].items()))
                lines.append("")
            if doc.get("agreement"):
                for mode, a in doc["agreement"].items():
                    if a:
                        lines.append(f"- {mode}: {a['nodes']} nodes, correlation {_sci(a['correlation'])}, "
                                     f"max |adjoint - ablation| {_sci(a['max_abs_difference'])}, "
                                     f"sum adjoint {_sci(a['sum_adjoint'])} / ablation {_sci(a['sum_ablation'])}")
                lines.append("")
        elif "models" in doc:
            lines.append("| model | mode | output: GPU | emulated | ratio | layers within 2x | median layer ratio | "
                         "top-5 overlap | TF32 not applied |")
            lines.append("|---|---|---|---|---|---|---|---|---|")
            for name, rec in doc["models"].items():
                if "error" in rec:
                    lines.append(f"| {name} | | {rec['error'][:60]} | | | | | | |")
                    continue
                for mode, e in rec["modes"].items():
                    if e.get("native_error") or e.get("emulated_error"):
                        lines.append(f"| {name} | {mode} | {e.get('native_error') or ''} | {e.get('emulated_error') or ''} "
                                     "| | | | | |")
                        continue
                    out_n = _sci(e["native_output"]) if e["native_finite"] else "inf/NaN"
                    out_e = _sci(e["emulated_output"]) if e["emulated_finite"] else "inf/NaN"
                    within = e["layers_within_2x"]
                    not_applied = len(e.get("tf32_not_applied", [])) if mode == "tf32" else ""
                    lines.append(f"| {name} | {mode} | {out_n} | {out_e} | {_sci(e['output_ratio'])} | "
                                 f"{'n/a' if within is None else f'{within:.0%}'} of {e['layers']} | "
                                 f"{_sci(e['layer_ratio_median'])} | {_sci(e['top5_overlap'])} | {not_applied} |")
            lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speed")
    s.add_argument("--device", default="cuda")
    s.add_argument("--model", default="resnet50", help="a torchvision model, or several separated by commas")
    s.add_argument("--batch", type=int, default=32)
    s.add_argument("--ablate", action="store_true")
    s.add_argument("--repeats", type=int, default=5, help="warm probe runs after the first (their median is reported)")
    s.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own)")
    s.add_argument("--out")
    a = sub.add_parser("agree")
    a.add_argument("--models", default="resnet18,resnet50,mobilenet_v3_large,efficientnet_b0,convnext_tiny,"
                                        "regnet_y_400mf,vit_b_16,swin_t,tiny_gpt,mlp_block")
    a.add_argument("--modes", default="tf32,fp16,bf16,fp16-full,bf16-full")
    a.add_argument("--cpu", default="", help="models to emulate on the CPU as well")
    a.add_argument("--out")
    r = sub.add_parser("report")
    r.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "speed":
        if args.threads:
            torch.set_num_threads(args.threads)
        names = args.model.split(",")
        if len(names) == 1:
            record = speed(args)
        else:  # several models in one file: {"speed": {model: its record}}
            record = {"machine": machine(args.device), "command": "speed", "speed": {}}
            for name in names:
                record["speed"][name] = speed(argparse.Namespace(**dict(vars(args), model=name, out=None)))
                _write(args.out, record)
        _write(args.out, record)
        print(json.dumps({k: v for k, v in record.items() if k != "ledger"}, indent=1, default=str)[:20000])
    elif args.command == "agree":
        agree(args)
    else:
        print(report(args.paths))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
