"""Benchmark: how many static findings the probe refutes on public models built from their configs.

A static warning that the probe refutes is noise in CI. For timm and transformers models with random
weights (nothing downloaded) this runs `preclint check --probe cpu` (the CPU emulation of each
precision; `--device cuda` measures on a GPU) and counts the findings the probe confirmed, refuted, or could not measure:

    python benchmarks/refuted.py run --out after.json [--models levit_128s t5 ...]
    PYTHONPATH=/path/to/other/checkout python benchmarks/refuted.py run --out before.json
    python benchmarks/refuted.py report before.json after.json

Each model runs in its own process (a file written to a temporary folder, as a user would give it).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Dict, List

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import stamp  # noqa: E402

PROBE_ONLY = "PCL900"

_TIMM = """import timm, torch
torch.manual_seed(0)
model = timm.create_model({name!r}, pretrained=False, num_classes=100).eval()
example_inputs = (torch.randn(1, 3, {size}, {size}),)
"""

_TORCHVISION = """import torch, torchvision
torch.manual_seed(0)
model = torchvision.models.{name}(weights=None, {kwargs}).eval()
example_inputs = (torch.randn(1, 3, {size}, {size}),)
"""

_TRANSFORMERS = """import torch
import transformers
torch.manual_seed(0)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = transformers.{cls}(transformers.{config}({kwargs}))

    def forward(self, {args}):
        return self.inner({call}).{field}


model = Model().eval()
example_inputs = ({inputs},)
"""

_IDS = "torch.randint(0, 512, (2, {n}))"
_LM = dict(args="input_ids", call="input_ids=input_ids", field="logits", inputs=_IDS.format(n=64))
MODELS: Dict[str, str] = {
    "levit_128s": _TIMM.format(name="levit_128s", size=224),
    "efficientnet_b0": _TIMM.format(name="efficientnet_b0", size=160),
    "convnext_tiny": _TIMM.format(name="convnext_tiny", size=160),
    "vit_tiny": _TIMM.format(name="vit_tiny_patch16_224", size=224),
    "inception_v3": _TORCHVISION.format(name="inception_v3", kwargs="aux_logits=False, init_weights=True", size=160),
    "llama": _TRANSFORMERS.format(
        cls="LlamaForCausalLM", config="LlamaConfig", **_LM,
        kwargs="hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, "
               "num_key_value_heads=2, vocab_size=512"),
    "t5": _TRANSFORMERS.format(
        cls="T5ForConditionalGeneration", config="T5Config", args="input_ids, decoder_input_ids",
        call="input_ids=input_ids, decoder_input_ids=decoder_input_ids", field="logits",
        inputs=_IDS.format(n=32) + ", " + _IDS.format(n=16),
        kwargs="d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=512, d_kv=16"),
    "gpt2": _TRANSFORMERS.format(cls="GPT2LMHeadModel", config="GPT2Config", **_LM,
                                 kwargs="n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128"),
    # attention scores in float32 with autocast switched off (transformers' maybe_autocast)
    "gpt2_upcast": _TRANSFORMERS.format(cls="GPT2LMHeadModel", config="GPT2Config", **_LM,
                                        kwargs="n_embd=64, n_layer=2, n_head=4, vocab_size=512, n_positions=128, "
                                               "reorder_and_upcast_attn=True, attn_implementation='eager'"),
    "bert": _TRANSFORMERS.format(
        cls="BertModel", config="BertConfig", args="input_ids", call="input_ids=input_ids",
        field="last_hidden_state", inputs=_IDS.format(n=64),
        kwargs="hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=512"),
}


def run(models: List[str], out: str, timeout: int, device: str) -> None:
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for name in models:
            path = os.path.join(folder, f"{name}.py")
            with open(path, "w") as handle:
                handle.write(MODELS[name])
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "preclint", "check", path, "--probe", device,
                                   "--output-format", "json", "--exit-zero"],
                                  capture_output=True, text=True, timeout=timeout, cwd=folder)
            seconds = time.perf_counter() - start
            try:
                report = json.loads(proc.stdout)
            except json.JSONDecodeError:
                results[name] = {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1]}
                print(f"{name}: failed: {results[name]['error']}", flush=True)
                continue
            # PCL900 is the probe's own finding (a hot spot no rule flagged): not a static one
            findings = [{"code": f["code"], "status": f.get("status"), "message": f["message"],
                         "precisions": f.get("precisions")} for f in report["findings"] if f["code"] != PROBE_ONLY]
            results[name] = {"findings": findings, "seconds": round(seconds, 1),
                             "summary": {m: s.get("predicted_output") for m, s in report.get("summary", {}).items()},
                             "measured": {m: s.get("measured_output") for m, s in report.get("summary", {}).items()}}
            counts = Counter(f["status"] or "unmeasured" for f in findings)
            print(f"{name}: {dict(counts)} in {seconds:.0f}s", flush=True)
    with open(out, "w") as handle:
        json.dump(stamp(results), handle, indent=1)


def report(files: List[str]) -> None:
    runs = [json.load(open(f)) for f in files]
    names = [n for n in MODELS if any(n in r for r in runs)]
    print("| model | " + " | ".join(f"{os.path.basename(f)}: findings (refuted / confirmed / unmeasured)" for f in files) + " |")
    print("|---|" + "---|" * len(files))
    totals = [Counter() for _ in files]
    for name in names:
        cells = []
        for run_, total in zip(runs, totals):
            entry = run_.get(name)
            if entry is None or "error" in entry:
                cells.append("failed" if entry else "-")
                continue
            static = [f for f in entry["findings"] if f["code"] != PROBE_ONLY]
            counts = Counter(f["status"] or "unmeasured" for f in static)
            total.update(counts)
            total["all"] += len(static)
            refuted = sorted({f["code"] for f in static if f["status"] == "refuted"})
            cells.append(f"{len(static)} ({counts['refuted']} / {counts['confirmed']} / {counts['unmeasured']})"
                         + (f" refuted: {', '.join(refuted)}" if refuted else ""))
        print(f"| {name} | " + " | ".join(cells) + " |")
    cells = [f"{t['all']} ({t['refuted']} / {t['confirmed']} / {t['unmeasured']}), refuted "
             f"{100.0 * t['refuted'] / max(1, t['all']):.1f}%" for t in totals]
    print("| **all** | " + " | ".join(cells) + " |")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    r.add_argument("--out", required=True)
    r.add_argument("--timeout", type=int, default=1800)
    r.add_argument("--device", default="cpu", help="the probe's device: cpu (emulation) or cuda")
    p = sub.add_parser("report")
    p.add_argument("files", nargs="+")
    args = parser.parse_args(argv)
    if args.command == "run":
        run(args.models, args.out, args.timeout, args.device)
    else:
        report(args.files)
    return 0


if __name__ == "__main__":
    sys.exit(main())
