"""Issue 39's model classes, as a user hands them to preclint: TorchScript (scripted, loaded from a file,
and one the converter refuses), a model stored in bfloat16, an int8 ``quantize_dynamic`` model, a
``torch.compile``d model (beside its eager twin), a transformers decode step with a ``DynamicCache``, a
hand-written KV-cache decode step, SigLIP's several outputs, and an FNO that builds a CPU tensor in its
forward. Each is checked by the CLI in a subprocess with ``--probe DEVICE``; with ``--before DIR`` also
by the preclint of another checkout (``git archive`` of main), to show what changed.

    python benchmarks/model_classes.py --device cpu --before /tmp/before --out benchmarks/results/model_classes_cpu.json
    python benchmarks/model_classes.py --device cuda --models fno_cpu_grid --out fno_cuda.json

Per model it records the exit code, the error line where the check failed, the wall time, the notes that
say what class the model is (and the probe's notes), and per precision and output the predicted and
measured relative RMS error and their ratio (measured over predicted).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import ROOT, stamp  # noqa: E402

CNN = """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(dim=(2, 3)))


torch.manual_seed(0)
example_inputs = (torch.randn(4, 3, 16, 16),)
"""

MODELS: Dict[str, str] = {
    "torchscript_scripted": CNN + "model = torch.jit.script(Net().eval())\n",
    "torchscript_loaded": CNN + """\
import os
_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "net.jit")
torch.jit.save(torch.jit.script(Net().eval()), _path)
model = torch.jit.load(_path)
""",
    "torchscript_loop": """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.cell = nn.LSTMCell(8, 16)

    def forward(self, x):
        h = torch.zeros(x.shape[0], 16)
        c = torch.zeros(x.shape[0], 16)
        for t in range(x.shape[1]):
            h, c = self.cell(x[:, t], (h, c))
        return h


torch.manual_seed(0)
model = torch.jit.script(Net().eval())
example_inputs = (torch.randn(2, 5, 8),)
""",
    "bf16_transformer": """\
import torch
from torch import nn
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, dropout=0.0)
model = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval().to(torch.bfloat16)
example_inputs = (torch.randn(2, 16, 64, dtype=torch.bfloat16),)
""",
    "int8_dynamic": """\
import torch
from torch import nn
torch.manual_seed(0)
float_model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32), nn.LayerNorm(32)).eval()
model = torch.ao.quantization.quantize_dynamic(float_model, {nn.Linear}, dtype=torch.qint8)
example_inputs = (torch.randn(8, 64),)
""",
    "compiled": """\
import torch
from torch import nn
torch.manual_seed(0)
model = torch.compile(nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval())
example_inputs = (torch.randn(8, 64),)
""",
    "compiled_eager_twin": """\
import torch
from torch import nn
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 32)).eval()
example_inputs = (torch.randn(8, 64),)
""",
    "llama_dynamic_cache": """\
import torch
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).eval()


def example_inputs():
    with torch.no_grad():
        cache = model(torch.randint(0, 128, (1, 8)), use_cache=True).past_key_values
    return {"input_ids": torch.randint(0, 128, (1, 1)), "past_key_values": cache, "use_cache": True}
""",
    "kv_decode_step": """\
import torch
from torch import nn
import torch.nn.functional as F


class DecodeStep(nn.Module):
    def __init__(self, vocab=256, dim=64, heads=4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, token, past_k, past_v):
        x = self.embed(token)
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.heads, -1).transpose(1, 2) for z in (q, k, v))
        k = torch.cat([past_k, k], dim=2)
        v = torch.cat([past_v, v], dim=2)
        y = self.proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, t, d))
        return self.head(self.norm(x + y)), k, v


torch.manual_seed(0)
model = DecodeStep()
example_inputs = (torch.randint(0, 256, (2, 1)), 3 * torch.randn(2, 4, 31, 16), 3 * torch.randn(2, 4, 31, 16))
""",
    "siglip": """\
import torch
from transformers import SiglipConfig, SiglipModel

torch.manual_seed(0)
config = SiglipConfig(
    text_config=dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                     num_attention_heads=2, max_position_embeddings=16),
    vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                       image_size=32, patch_size=8),
)
model = SiglipModel(config).eval()
example_inputs = {"input_ids": torch.randint(0, 100, (2, 16)), "pixel_values": torch.randn(2, 3, 32, 32)}
""",
    "fno_cpu_grid": (ROOT / "tests" / "models" / "fno_cpu_grid.py").read_text(),
}

# Notes that say what class a model is, or what the probe could not do: the lines this benchmark is about.
CLASS_NOTES = ("TorchScript", "torch.compile", "stored in", "is quantized", "object that holds tensors",
               "probe: not run", "measured output", "measured an output")


def check(source: str, device: str, directory: str, pythonpath: str, timeout: float) -> Dict:
    path = os.path.join(directory, "model.py")
    with open(path, "w") as f:
        f.write(source)
    command = [sys.executable, "-m", "preclint", "check", path, "--isolated", "--output-format", "json",
               "--probe", device]
    env = dict(os.environ, PYTHONPATH=pythonpath, COLUMNS="160")
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=directory)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "wall_s": round(time.perf_counter() - start, 1)}
    wall = round(time.perf_counter() - start, 1)
    entry: Dict = {"exit_code": done.returncode, "wall_s": wall}
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        report = None
    errors = [line for line in done.stderr.splitlines() if line.startswith("preclint:")]
    if report is None or report.get("error"):
        entry["error"] = (report or {}).get("error") or (errors[-1] if errors else done.stderr.strip()[-400:])
        entry["internal_error"] = "internal error" in entry["error"]
        return entry
    entry["internal_error"] = False
    entry["capture"] = report.get("capture")
    entry["precisions"] = report.get("precisions")
    entry["notes"] = [n for n in report.get("notes", []) if any(key in n for key in CLASS_NOTES)]
    entry["modes"] = {mode: _figures(figures) for mode, figures in report.get("summary", {}).items()}
    return entry


def _figures(summary: Dict) -> Dict:
    predicted = (summary.get("predicted_output") or {}).get("rel_error")
    measured = (summary.get("measured_output") or {}).get("rel_error")
    out: Dict = {"predicted": predicted, "measured": measured, "ratio": _ratio(measured, predicted)}
    each = summary.get("outputs") or []
    each_measured = (summary.get("measured_output") or {}).get("outputs") or []
    if each:
        out["outputs"] = [{"output": p["output"], "predicted": p["rel_error"],
                           "measured": m.get("rel_error") if m else None,
                           "ratio": _ratio(m.get("rel_error") if m else None, p["rel_error"])}
                          for p, m in zip(each, each_measured or [None] * len(each))]
    return out


def _ratio(measured: Optional[float], predicted: Optional[float]) -> Optional[float]:
    if measured is None or predicted is None:
        return None
    if predicted == 0:
        return None if measured else 1.0
    return round(measured / predicted, 3)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="all", help="comma-separated names (default: all)")
    parser.add_argument("--before", help="another checkout's root: its preclint checks each model too")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    names = list(MODELS) if args.models == "all" else args.models.split(",")
    result: Dict = {"device": args.device, "models": {}}
    for name in names:
        entry: Dict = {}
        for label, root in (("now", str(ROOT)), ("before", args.before)):
            if root is None:
                continue
            with tempfile.TemporaryDirectory() as directory:
                entry[label] = check(MODELS[name], args.device, directory, root, args.timeout)
            print(name, label, json.dumps(entry[label])[:300], flush=True)
        result["models"][name] = entry
    now = result["models"]
    result["summary"] = {
        "models": len(now),
        "checked_now": sorted(n for n, e in now.items() if "error" not in e["now"]),
        "internal_errors_now": sorted(n for n, e in now.items() if e["now"].get("internal_error")),
        "refused_now": sorted(n for n, e in now.items() if "error" in e["now"] and not e["now"].get("internal_error")),
    }
    if args.before:
        result["summary"]["internal_errors_before"] = sorted(n for n, e in now.items() if e["before"].get("internal_error"))
        result["summary"]["refused_before"] = sorted(n for n, e in now.items() if "error" in e["before"]
                                                     and not e["before"].get("internal_error"))
    with open(args.out, "w") as f:
        json.dump(stamp(result), f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
