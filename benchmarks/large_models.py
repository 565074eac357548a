"""Benchmark: `preclint probe` on Llama-shaped models (random init from the config, 1 x 256 tokens).

    python benchmarks/large_models.py --size 7b --mode unstreamed --out $OUT            # one GPU
    python benchmarks/large_models.py --size 13b --mode streamed --out $OUT             # one GPU
    torchrun --standalone --nproc-per-node 2 benchmarks/large_models.py --size 13b --mode distributed --out $OUT
    python benchmarks/large_models.py --size 1b --mode unstreamed --tokens 2048 --out $OUT  # a longer input
    python benchmarks/large_models.py --compare $OUT/1b_unstreamed.json $OUT/1b_streamed.json
    python benchmarks/large_models.py --size tiny --mode streamed --device cpu --out /tmp/lm   # the script itself

The model is built on its device directly (``with torch.device(...)``: each layer's weights are made
and initialised there, never whole on the host). The probe is what `preclint probe` runs: the check
(capture, reference statistics on the device, predictions, rules) and the measurement of every
mode, with the ledger of every node. ``--mode``: ``unstreamed`` (whole copies on the device),
``streamed`` (one block at a time, probe/stream.py), ``distributed`` (under torchrun: rank 0 checks
while the other ranks measure the modes, probe/distributed.py).

The probe runs ``--repeat`` times in the process (default 2) and the bare work ``--repeat`` - 1 times
after it, so that both find the GPU's libraries and kernels loaded: the figures are the median of the
probe's runs after the first (by their total) and the median bare work, as a single run of either
moves by 20% from one run to the next on the GPU machines; every run is kept (``runs``,
``bare_runs``), and the first one, which also pays for loading the libraries, beside (``first_run``).

The bare work, timed in the same process on the same device: building the model, one float64
forward (streamed a layer at a time where the float64 copy does not fit) and one forward per mode
(TF32 on; autocast float16 / bfloat16), no autograd, nothing observed. Figures: wall times, peak GPU
memory (torch's allocator), peak host memory (the process's resident set), the probe over the bare
work, and a digest of the ledger (per mode and node: local and received error, contribution, to
three significant digits as printed) that ``--compare`` checks between two runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from typing import Any, Dict, Optional

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import stamp  # noqa: E402
from preclint.core.notes import texts  # noqa: E402
from preclint.config import Config  # noqa: E402
from preclint.engine import CheckOptions, check_model  # noqa: E402
from preclint.load.loader import LoadedModel  # noqa: E402
from preclint.load.modelio import Inputs  # noqa: E402
from preclint.probe import ProbeOptions, probe_report  # noqa: E402
from preclint.probe.device_copy import Placement  # noqa: E402

MODES = ("tf32", "fp16", "bf16")

# Llama-shaped configurations (TinyLlama-1.1B, Llama-2-7B, Llama-2-13B) and a tiny one for the CPU
SIZES: Dict[str, Dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tokens=16),
    # a 7B's depth and graph (1795 nodes) at a width the CPU runs in seconds: the probe's cost per op
    "narrow": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=32, num_attention_heads=8,
                   num_key_value_heads=8, vocab_size=512, tokens=64),
    "1b": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
               num_key_value_heads=4, vocab_size=32000, tokens=256),
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32, vocab_size=32000, tokens=256),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40, vocab_size=32000, tokens=256),
}


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_peak_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20  # KiB on Linux


def gpu_peak_gib(device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else 0.0


def build(size: str, device, seed: int = 0, tokens: Optional[int] = None):
    """The model, made and initialised on ``device`` layer by layer, and its input ids (``tokens`` of
    them, the size's own number by default)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(SIZES[size])
    own_length = shape.pop("tokens")
    tokens = own_length if tokens is None else tokens
    config = LlamaConfig(**shape, max_position_embeddings=max(tokens, 64), bos_token_id=0, eos_token_id=0,
                         attn_implementation="sdpa", use_cache=False)  # the output: the logits alone
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, shape["vocab_size"], (1, tokens), generator=torch.Generator().manual_seed(seed)).to(device)
    return model, ids


def bare_work(model, ids, device, modes) -> Dict[str, float]:
    """One float64 forward and one forward per mode, timed; nothing observed."""
    from preclint.probe.stream import WeightStream, model_bytes

    out: Dict[str, float] = {}
    with torch.no_grad():
        sync(device)
        start = time.perf_counter()
        free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else math.inf
        if 2.2 * model_bytes(model) < free:
            from preclint.measure.copies import copy_to

            model64 = copy_to(model, device, torch.float64)
            model64(ids)
            del model64
        else:  # a float64 copy does not fit: converted one layer at a time
            stream = WeightStream(model, device)
            model64 = stream.copy(torch.float64)
            with stream.active():
                model64(ids)
            del model64, stream
        sync(device)
        out["forward_float64_s"] = time.perf_counter() - start
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for mode in modes:
            start = time.perf_counter()
            if mode == "tf32":
                from preclint.measure.backends import tf32

                with tf32(True):
                    model(ids)
            else:
                dtype = torch.float16 if mode.startswith("fp16") else torch.bfloat16
                if mode.endswith("-full"):
                    continue  # a cast copy per mode: not in the bare work of autocast modes
                with torch.autocast(device.type, dtype=dtype):
                    model(ids)
            sync(device)
            out[f"forward_{mode}_s"] = time.perf_counter() - start
    return out


def release(device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def digest(result) -> Dict[str, Dict[str, list]]:
    """Per mode and node: (local, received, contribution) to three significant digits."""
    def short(value):
        return None if value is None else float(f"{value:.3g}")

    table = {}
    for mode, measure in result.modes.items():
        table[mode] = {name: [short(m.local.rel_error if m.local else None),
                              short(m.received.rel_error if m.received else None), short(m.contribution)]
                       for name, m in measure.nodes.items()}
    return table


def probe(model, ids, device, modes, stream, ranks=None):
    """`preclint probe` on the model, in this process; (report, result, seconds of the check, of the
    probe). Under torchrun, as `torchrun -m preclint probe` runs: rank 0 checks and takes the other
    ranks' measurements (its probe time is the wait for them); the others measure (their report and
    result are None, their check time 0)."""
    from preclint.probe import probed
    from preclint.probe.distributed import Leader, Measurer

    loaded = LoadedModel(model, (ids,), "llama", None)
    placement = Placement(device, model, Inputs((ids,))) if device.type == "cuda" else None
    config = Config(precisions=tuple(modes))
    options = ProbeOptions(device=device.type, ledger=True, stream=stream)
    sync(device)
    start = time.perf_counter()
    if ranks is not None and not ranks.leader:
        module, inputs = probed(loaded, placement)
        part = Measurer(ranks).model(modes)
        part.measure(module, inputs, None, modes, options, name=loaded.name)
        part.close()
        sync(device)
        return None, None, 0.0, time.perf_counter() - start
    report, graph, ctx = check_model(loaded, config, CheckOptions(modes=tuple(modes), placement=placement))
    sync(device)
    checked = time.perf_counter()
    part = Leader(ranks).model(modes) if ranks is not None else None
    result = probe_report(loaded, report, ctx, config, options, placement=placement, measurer=part)
    if part is not None:
        part.close()
    sync(device)
    return report, result, checked - start, time.perf_counter() - checked


def share_one_gpu():
    """--share-gpu: every rank on the one GPU there is, the ranks joined over gloo (NCCL wants a GPU
    each). A stand-in where only a one-GPU machine is lent: the ranks' Python runs side by side as on
    two GPUs, their kernels share one, and their copies of the model must fit it together."""
    import datetime

    import torch.distributed as dist

    from preclint.probe.distributed import Ranks

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    return Ranks(rank, world, 0)


def run(args) -> Dict[str, Any]:
    ranks = None
    if args.mode == "distributed" and args.share_gpu:
        ranks = share_one_gpu()
    elif args.mode == "distributed":
        from preclint.probe.distributed import join

        ranks = join(args.device)
    device = torch.device(args.device if args.device == "cpu" else f"cuda:{torch.cuda.current_device()}")
    modes = tuple(args.precision.split(","))
    import transformers.models.llama.modeling_llama  # noqa: F401  (imported before the clock starts)

    sync(device)
    start = time.perf_counter()
    model, ids = build(args.size, device, tokens=args.tokens)
    sync(device)
    build_s = time.perf_counter() - start
    params = sum(p.numel() for p in model.parameters())
    # (ranks sharing one GPU stream: two whole copies of the model do not fit beside each other)
    stream = True if args.share_gpu else {"unstreamed": False, "streamed": True}.get(args.mode)
    runs = []
    report = result = None
    for run_index in range(max(1, args.repeat)):
        if run_index:  # the earlier run's report and copies go before the next one is made
            report = result = None
            release(device)
        report, result, check_s, probe_s = probe(model, ids, device, modes, stream, ranks)
        runs.append({"check_s": check_s, "probe_s": probe_s, "stages_s": result.timings if result else None})
    cold = runs[0] if len(runs) > 1 else None
    typical = median(runs[1:] or runs, key=lambda r: r["check_s"] + r["probe_s"])
    check_s, probe_s = typical["check_s"], typical["probe_s"]
    peaks = [gpu_peak_gib(device)]
    if ranks is not None:  # every rank's peak GPU memory; then rank 0 alone goes on
        import torch.distributed as dist
        from preclint.probe.distributed import leave

        peak = gpu_peak_gib(device)
        if not ranks.leader:  # its memory freed before rank 0 times the bare work (--share-gpu: the same GPU)
            del model, ids, report, result
            release(device)
        peaks = [None] * ranks.world
        dist.all_gather_object(peaks, peak)
        leave()
        if not ranks.leader:
            return {}
    figures: Dict[str, Any] = {
        "size": args.size, "mode": args.mode, "params": params, "tokens": ids.shape[1], "modes": list(modes),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "ranks": ranks.world if ranks else 1,
        "build_s": build_s, "check_s": check_s, "probe_s": probe_s, "preclint_s": check_s + probe_s,
        # the process's first run, which also loads the GPU's libraries and kernels (the bare work,
        # timed after the runs, does not): what a one-off `preclint probe` pays on top
        "first_run": {"check_s": cold["check_s"], "probe_s": cold["probe_s"]} if cold else None,
        "gpu_peak_gib": max(peaks), "gpu_peak_gib_per_rank": peaks, "host_peak_gib": host_peak_gib(),
        "streamed": result.environment.get("streamed"), "stages_s": typical["stages_s"],
        "runs": [{k: v for k, v in r.items() if k != "stages_s"} for r in runs],
        "errors": {mode: m.error for mode, m in result.modes.items() if m.error},
        "notes": texts(result.notes),  # (a mode measured without contributions says so here)
        "output_rel_error": {mode: m.output.rel_error if m.output else None for mode, m in result.modes.items()},
    }
    ledger = digest(result)
    del report, result
    release(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    bare_runs = [bare_work(model, ids, device, modes) for _ in range(max(1, args.repeat - 1))]
    bare = median(bare_runs, key=lambda b: sum(b.values()))
    figures["bare"] = dict(bare, build_s=build_s, gpu_peak_gib=gpu_peak_gib(device))
    figures["bare_runs"] = [sum(b.values()) for b in bare_runs]
    bare_total = build_s + sum(bare.values())
    figures["bare_s"] = bare_total
    figures["over_bare"] = (build_s + check_s + probe_s) / bare_total
    figures["ledger"] = ledger
    os.makedirs(args.out, exist_ok=True)
    name = f"{args.size}_{args.mode}" + ("_one_gpu" if args.share_gpu else "") + (f"_{args.tokens}tokens" if args.tokens else "")
    path = os.path.join(args.out, f"{name}.json")
    with open(path, "w") as f:
        json.dump(stamp(figures), f, indent=1)
    shown = {k: v for k, v in figures.items() if k not in ("ledger", "stages_s")}
    print(json.dumps(shown, indent=1))
    return figures


def median(items: list, key):
    """The middle item by ``key`` (the lower middle of an even number)."""
    return sorted(items, key=key)[(len(items) - 1) // 2]


def compare(a_path: str, b_path: str) -> int:
    """Whether two runs' ledgers agree to the printed precision; the nodes where they do not."""
    a, b = (json.load(open(p))["ledger"] for p in (a_path, b_path))
    differing = [(mode, name, row, b.get(mode, {}).get(name)) for mode in a for name, row in a[mode].items()
                 if b.get(mode, {}).get(name) != row]
    total = sum(len(rows) for rows in a.values())
    print(f"{total - len(differing)} of {total} ledger rows agree to three significant digits")
    for mode, name, x, y in differing[:20]:
        print(f"  {mode} {name}: {x} vs {y}")
    return 0 if not differing else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--mode", choices=("unstreamed", "streamed", "distributed", "auto"), default="auto")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--precision", default=",".join(MODES))
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of the probe in the process (the bare work runs one time fewer); the figures "
                             "are the median of the runs after the first, and the median bare work")
    parser.add_argument("--share-gpu", action="store_true",
                        help="with --mode distributed on a one-GPU machine: every rank on that GPU (see share_one_gpu)")
    parser.add_argument("--tokens", type=int, help="input length (default: the size's own, 256 for 1b-13b)")
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/large_models"))
    parser.add_argument("--compare", nargs=2, metavar="JSON")
    args = parser.parse_args()
    if args.compare:
        return compare(*args.compare)
    run(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
