"""Benchmark: what torch.compile (Inductor) does to a model's numbers, and the probe's time with it.

Per model and precision (random weights, built from configs: nothing downloaded) the output error of
the eager and of the compiled model against the same float64 reference (probe/compiled.py), the
compiled model again with ``emulate_precision_casts``, the audit of the compiled graph (its dtypes
against eager's, the model's own float32 decisions), the compilation's record (seconds, graphs,
graph breaks, recompilations), and the probe's time without and with the compiled backend:

    python benchmarks/compiled.py --device cpu --out benchmarks/results/compiled_cpu.json
    python benchmarks/compiled.py --device cuda --size large --out compiled_h200.json

``--size small`` (the CPU default) builds each model a few layers deep and narrow; ``large`` builds
them at the width of the real ones (fewer layers). ``--budget`` seconds: models not started by then
are listed as skipped, so that a run ends in time. ``--attribute`` also compiles each model's blocks
one at a time (compiled_blocks.py), one compilation a block.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.provenance import stamp  # noqa: E402

MODES = ("bf16", "fp16")


def _llama(size: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    width, layers, seq = (64, 2, 16) if size == "small" else (1024, 4, 256)
    config = LlamaConfig(vocab_size=512, hidden_size=width, intermediate_size=width * 4, num_hidden_layers=layers,
                         num_attention_heads=4 if size == "small" else 16, num_key_value_heads=2 if size == "small" else 8,
                         max_position_embeddings=seq * 2, attn_implementation="eager")
    return _hf(LlamaForCausalLM(config), config.vocab_size, seq)


def _qwen2(size: str):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    width, layers, seq = (64, 2, 16) if size == "small" else (896, 4, 256)
    config = Qwen2Config(vocab_size=512, hidden_size=width, intermediate_size=width * 4, num_hidden_layers=layers,
                         num_attention_heads=4 if size == "small" else 14, num_key_value_heads=2,
                         max_position_embeddings=seq * 2, attn_implementation="eager")
    return _hf(Qwen2ForCausalLM(config), config.vocab_size, seq)


def _bert(size: str):
    from transformers import BertConfig, BertModel

    width, layers, seq = (64, 2, 16) if size == "small" else (768, 4, 256)
    config = BertConfig(vocab_size=512, hidden_size=width, intermediate_size=width * 4, num_hidden_layers=layers,
                        num_attention_heads=4 if size == "small" else 12, max_position_embeddings=seq * 2,
                        attn_implementation="eager")
    return _hf(BertModel(config), config.vocab_size, seq)


class _Logits(torch.nn.Module):
    """A Hugging Face model's logits (or last hidden state) as its one output."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids)
        return out.logits if hasattr(out, "logits") else out.last_hidden_state


def _hf(model, vocab: int, seq: int):
    model.config.use_cache = False
    ids = torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(0))
    return _Logits(model.eval()), (ids,)


def _timm(name: str, small: dict):
    def build(size: str):
        import timm

        kwargs = dict(small) if size == "small" else {}
        image = kwargs.get("img_size", 224)
        model = timm.create_model(name, pretrained=False, num_classes=100, **kwargs).eval()
        x = torch.randn(2, 3, image, image, generator=torch.Generator().manual_seed(0))
        return model, (x,)
    return build


def _chain(size: str):
    from tests.models.compiled_effects import PointwiseChain

    model = PointwiseChain(64 if size == "small" else 1024).eval()
    return model, (torch.randn(32 if size == "small" else 512, 64 if size == "small" else 1024,
                               generator=torch.Generator().manual_seed(0)),)


MODELS = {
    "pointwise_chain": _chain,
    "llama": _llama,
    "qwen2": _qwen2,
    "bert": _bert,
    "vit": _timm("vit_base_patch16_224", {"img_size": 32, "patch_size": 8, "embed_dim": 64, "depth": 2, "num_heads": 4}),
    "convnext": _timm("convnext_tiny", {"depths": (1, 1, 1, 1), "dims": (16, 32, 64, 128)}),
}


def measure(name: str, device: str, size: str, attribute: bool) -> dict:
    from preclint.config import Config
    from preclint.engine import CheckOptions, check_model
    from preclint.load.loader import LoadedModel
    from preclint.probe import ProbeOptions, measure_model, merge_into_report
    from preclint.core.notes import texts
    from preclint.probe.compiled import compare_backend
    from preclint.probe.device import synchronize

    torch.manual_seed(0)
    module, inputs = MODELS[name](size)
    loaded = LoadedModel(module, tuple(inputs), name, None)
    report, graph, ctx = check_model(loaded, Config(precisions=MODES), CheckOptions(modes=MODES, predict_errors=True))
    where = torch.device(device)
    start = time.perf_counter()
    result = measure_model(module, inputs, graph, MODES, ProbeOptions(device=device))
    synchronize(where)
    probe_seconds = time.perf_counter() - start
    start = time.perf_counter()
    model_on = module.to(where)
    inputs_on = tuple(t.to(where) for t in inputs)
    compared = compare_backend(model_on, inputs_on, graph, MODES, where, "inductor", attribute=attribute)
    synchronize(where)
    compiled_seconds = time.perf_counter() - start
    result.backend = compared
    merge_into_report(report, ctx, result, Config(precisions=MODES))
    out = {"model": name, "size": size, "probe_seconds": round(probe_seconds, 2),
           "compiled_seconds": round(compiled_seconds, 2),
           "probe_with_compiled_over_probe": round((probe_seconds + compiled_seconds) / probe_seconds, 2),
           "notes": texts(compared.notes), "modes": {},
           "pcl901": [f.message for f in report.findings if f.code == "PCL901"]}
    for mode, m in compared.modes.items():
        entry = m.to_json()
        entry["relative_change"] = (m.compiled - m.eager) / m.eager if m.compiled is not None and m.eager else None
        entry["kept_float32_held"] = sum(1 for k in m.kept if k.compiled_ops and not k.offending)
        entry["kept_float32_lost"] = sum(1 for k in m.kept if k.offending)
        out["modes"][mode] = entry
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--size", choices=("small", "large"), default=None, help="default: small on the CPU, large on cuda")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--attribute", action="store_true", help="also compile each model's blocks one at a time")
    parser.add_argument("--budget", type=float, default=float("inf"), help="start no model after this many seconds")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    size = args.size or ("small" if args.device == "cpu" else "large")
    started = time.perf_counter()
    results, skipped = [], []
    for name in args.models.split(","):
        if time.perf_counter() - started > args.budget:
            skipped.append(name)
            continue
        try:
            entry = measure(name, args.device, size, args.attribute)
        except Exception as exc:  # noqa: BLE001 - one model's failure is recorded, the others measured
            entry = {"model": name, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        results.append(entry)
        for mode, m in entry.get("modes", {}).items():
            print(f"{name:16s} {mode:5s} eager {m['eager_rel_error']:.3g} compiled {m['compiled_rel_error'] or float('nan'):.3g} "
                  f"emulated {m['emulated_casts_rel_error'] or float('nan'):.3g} first call "
                  f"{(m['compilation'] or {}).get('seconds')} s, breaks {(m['compilation'] or {}).get('graph_breaks')}",
                  flush=True)
        if "error" in entry:
            print(f"{name}: {entry['error']}", flush=True)
    doc = stamp({"device": args.device, "size": size, "modes": list(MODES), "models": results, "skipped": skipped,
                 "seconds": round(time.perf_counter() - started, 1)})
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
