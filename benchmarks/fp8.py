"""Benchmark: FP8 and block-scaled formats, predicted against measured, and emulation against hardware.

For small transformer and vision models (random init, seeded) and each scaled mode (fp8, fp8-rowwise,
mxfp8, nvfp4), the output's relative RMS error against float64:

* predicted by ``preclint check`` from the reference statistics (analyses/scaled_operands.py);
* measured by running the mode emulated (measure/scaled.py: float32 math, each operand quantised and
  dequantised per the recipe) on ``--device``;
* on a GPU with FP8 tensor cores, also measured natively: real FP8 GEMMs through torch._scaled_mm
  for fp8 and fp8-rowwise (MX and NVFP4 stay emulated on Hopper).

Layer by layer, each converted nn.Linear is fed the input the float32 model gives it, and its local
error (relative RMS against float64) is measured emulated and, on the GPU, on the hardware, beside
the prediction. Runs here (small sizes) and on an H200:

    python benchmarks/fp8.py --out benchmarks/results/fp8_cpu.json
    python benchmarks/fp8.py --device cuda --full --out benchmarks/results/fp8_h200.json

``--full`` uses full-size shapes (a Llama-shaped model of width 1024, BERT-base, torchvision's
ViT-B/16); the default sizes run in a few minutes on a 2-core CPU.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Dict, List

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.provenance import stamp  # noqa: E402
from preclint.config import Config  # noqa: E402
from preclint.core.numerics import BF16, C_OUTPUT, MODES, SCALED_MODES  # noqa: E402
from preclint.engine import CheckOptions, check_model  # noqa: E402
from preclint.load.loader import LoadedModel  # noqa: E402
from preclint.load.modelio import Inputs  # noqa: E402
from preclint.measure.compare import relative_rms  # noqa: E402
from preclint.measure.runners import run_mode, run_reference  # noqa: E402
from preclint.measure.scaled import ScaledLinear, converts, hardware_fp8  # noqa: E402
from preclint.probe import ProbeOptions, place_for_probe, probed  # noqa: E402
from preclint.reference.analyses.scaled_operands import ScaledOperands  # noqa: E402
from preclint.reference.analyses.terms import Terms  # noqa: E402

HARDWARE_MODES = ("fp8", "fp8-rowwise")


def _llama(full: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    width = 1024 if full else 128
    config = LlamaConfig(vocab_size=2048 if full else 512, hidden_size=width, intermediate_size=width * 8 // 3 // 16 * 16,
                         num_hidden_layers=4 if full else 2, num_attention_heads=8 if full else 4,
                         num_key_value_heads=8 if full else 4, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 128 if full else 32))
    return _Logits(model), (ids,)


def _bert(full: bool):
    from transformers import BertConfig, BertModel

    width = 768 if full else 128
    config = BertConfig(vocab_size=2048 if full else 512, hidden_size=width, num_hidden_layers=12 if full else 2,
                        num_attention_heads=12 if full else 4, intermediate_size=4 * width)
    model = BertModel(config, add_pooling_layer=False).eval()
    ids = torch.randint(0, config.vocab_size, (2, 128 if full else 32))
    return _Hidden(model), (ids,)


def _vit(full: bool):
    import torchvision

    if full:
        model, inputs = torchvision.models.vit_b_16(weights=None).eval(), (torch.rand(2, 3, 224, 224),)
    else:
        model = torchvision.models.VisionTransformer(image_size=64, patch_size=16, num_layers=2, num_heads=4,
                                                     hidden_dim=128, mlp_dim=512).eval()
        inputs = (torch.rand(2, 3, 64, 64),)
    model.heads = torch.nn.Identity()  # torchvision zero-initialises the head: compare the features it reads
    return model, inputs


def _massive(full: bool):
    """A decoder whose residual stream carries one massive activation channel (as trained LLMs do)."""
    from benchmarks.zoo import TinyGPT

    model = TinyGPT(width=512 if full else 128, depth=4 if full else 2, context=256).eval()
    with torch.no_grad():
        model.tokens.weight[:, 7] *= 300.0
    return model, (torch.randint(0, 512, (2, 128 if full else 32)),)


class _Logits(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).logits


class _Hidden(torch.nn.Module):
    def __init__(self, model) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids).last_hidden_state


MODELS = {"llama": _llama, "bert": _bert, "vit": _vit, "massive_channel": _massive}


def relative(output, reference) -> float:
    """The relative RMS error preclint reports (measure.compare.relative_rms); nan where there is none."""
    found = relative_rms([output], [reference])
    return math.nan if found is None else found


def layer_inputs(model: torch.nn.Module, inputs, recipe) -> Dict[str, torch.Tensor]:
    """The input each converted nn.Linear gets in a float32 run."""
    seen: Dict[str, torch.Tensor] = {}
    handles = [module.register_forward_pre_hook(lambda m, args, path=path: seen.setdefault(path, args[0].detach()))
               for path, module in model.named_modules() if converts(module, recipe)]
    try:
        with torch.no_grad():
            Inputs.of(inputs).call(model)
    finally:
        for handle in handles:
            handle.remove()
    return seen


def layers(model, inputs, graph, mode: str, device: torch.device, hardware: bool) -> List[Dict[str, Any]]:
    """Per converted layer: predicted, emulated and (``hardware``) measured local relative error."""
    recipe = MODES[mode].recipe
    predicted = {}
    for node in graph.nodes:
        record = node.record(ScaledOperands)
        if record is not None and mode not in record.rejected and node.module_path not in predicted:
            terms = node.record(Terms)
            if terms is not None and node.out is not None and node.out.rms > 0:
                # the operands' error relative to the terms, with bf16's rounding of the result
                local = math.hypot(record.combined(mode) * terms.rms, C_OUTPUT * BF16.unit_roundoff * node.out.rms)
                predicted[node.module_path] = local / node.out.rms
    rows = []
    for path, x in layer_inputs(model, inputs, recipe).items():
        with torch.no_grad():
            rows.append(_layer(model.get_submodule(path), x, recipe, predicted.get(path), path, hardware))
    return rows


def _layer(linear, x, recipe, predicted, path: str, hardware: bool) -> Dict[str, Any]:
    """One layer's local error on its float32 input: predicted, emulated, on the hardware."""
    reference = F.linear(x.double(), linear.weight.double(), None if linear.bias is None else linear.bias.double())
    row: Dict[str, Any] = {"layer": path, "predicted": predicted}
    row["emulated"] = relative(ScaledLinear(linear, recipe, "emulated", native=False)(x), reference)
    if hardware:
        row["hardware"] = relative(ScaledLinear(linear, recipe, "scaled_mm", native=True)(x), reference)
    return row


def measure(name: str, device: torch.device, full: bool) -> Dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = MODELS[name](full)
    start = time.perf_counter()
    loaded = LoadedModel(model, inputs, name, None)
    # on a GPU the reference pass runs on the probe's device copy, which every run below measures
    placement = place_for_probe(loaded, ProbeOptions(device=str(device))) if device.type == "cuda" else None
    model, inputs = probed(loaded, placement)
    modes = SCALED_MODES
    _report, graph, ctx = check_model(loaded, Config(precisions=("bf16",) + modes),
                                      CheckOptions(modes=("bf16",) + modes, placement=placement))
    check_seconds = time.perf_counter() - start
    reference = run_reference(model, inputs, device)
    out: Dict[str, Any] = {"model": name, "check_seconds": round(check_seconds, 1), "modes": {}}
    gpu_fp8 = hardware_fp8(device)
    for mode in ("bf16",) + modes:
        row: Dict[str, Any] = {"predicted": ctx.predictions[mode].rel_error}
        row["emulated"] = relative(run_mode(model, inputs, mode, device, emulated=True, graph=graph), reference)
        if gpu_fp8 and mode in HARDWARE_MODES + ("bf16",):
            row["hardware"] = relative(run_mode(model, inputs, mode, device, emulated=False, graph=graph), reference)
        measured = row.get("hardware", row["emulated"])
        row["predicted_over_measured"] = row["predicted"] / measured if row["predicted"] and measured else None
        if mode != "bf16":
            row["layers"] = layers(model, inputs, graph, mode, device, gpu_fp8 and mode in HARDWARE_MODES)
        out["modes"][mode] = row
        print(f"{name:16s} {mode:12s} predicted {row['predicted']:.3g}  emulated {row['emulated']:.3g}"
              + (f"  hardware {row['hardware']:.3g}" if "hardware" in row else "")
              + (f"  ratio {row['predicted_over_measured']:.2f}" if row["predicted_over_measured"] else ""), flush=True)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--full", action="store_true", help="full-size models (for the GPU)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    results = [measure(name, device, args.full) for name in args.models.split(",")]
    ratios = [row["predicted_over_measured"] for r in results for m, row in r["modes"].items()
              if m != "bf16" and row["predicted_over_measured"]]
    summary = {"within_3x": sum(1 for q in ratios if 1 / 3 <= q <= 3), "pairs": len(ratios),
               "worst_ratio": max(ratios, key=lambda q: max(q, 1 / q)) if ratios else None,
               "hardware": hardware_fp8(device)}
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(stamp({"device": str(device), "full": args.full, "summary": summary, "models": results}), f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
