"""Issue 39's model classes, as a user hands them to preclint: TorchScript (scripted, loaded from a file,
and one the converter refuses), a model stored in bfloat16, an int8 ``quantize_dynamic`` model, a
``torch.compile``d model (beside its eager twin), a transformers decode step with a ``DynamicCache``, a
hand-written KV-cache decode step, SigLIP's several outputs, and an FNO that builds a CPU tensor in its
forward; then the further families (``--models more``) and hand-written loops that store their state in place
(``--models state``). Each is checked by the CLI in a subprocess with ``--probe DEVICE``; with ``--before DIR`` also
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
    "kv_decode_step": (ROOT / "tests" / "models" / "kv_decode_step.py").read_text(),
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

# The other families issue 39 tried, small enough for seconds each: recurrent layers, a recurrent
# language model, state-space models, a diffusion transformer, a multimodal model, a recommender,
# custom autograd, reparametrised weights and a graph transformer.
MORE_MODELS: Dict[str, str] = {
    "lstm_gru": """\
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.gru = nn.GRU(32, 32, batch_first=True)
        self.head = nn.Linear(32, 4)

    def forward(self, x):
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        return self.head(y[:, -1])


torch.manual_seed(0)
model = Net().eval()
example_inputs = (torch.randn(4, 48, 16),)
""",
    "rwkv": """\
import torch
from transformers import RwkvConfig, RwkvForCausalLM

torch.manual_seed(0)
model = RwkvForCausalLM(RwkvConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, attention_hidden_size=32,
                                   intermediate_size=64, context_length=64)).eval()
example_inputs = {"input_ids": torch.randint(0, 128, (2, 24))}
""",
    "mamba2": """\
import torch
from transformers import Mamba2Config, Mamba2ForCausalLM

torch.manual_seed(0)
model = Mamba2ForCausalLM(Mamba2Config(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32,
                                       state_size=16, expand=2, n_groups=1, chunk_size=16)).eval()
example_inputs = {"input_ids": torch.randint(0, 128, (2, 32))}
""",
    "whisper": """\
import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

torch.manual_seed(0)
model = WhisperForConditionalGeneration(WhisperConfig(
    vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, num_mel_bins=16, max_source_positions=32,
    max_target_positions=16, decoder_start_token_id=1, pad_token_id=0)).eval()
example_inputs = {"input_features": torch.randn(2, 16, 64), "decoder_input_ids": torch.randint(2, 128, (2, 8))}
""",
    "bart": """\
import torch
from transformers import BartConfig, BartForConditionalGeneration

torch.manual_seed(0)
model = BartForConditionalGeneration(BartConfig(
    vocab_size=128, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
    decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64)).eval()
example_inputs = {"input_ids": torch.randint(3, 128, (2, 16)), "decoder_input_ids": torch.randint(3, 128, (2, 8))}
""",
    "swinv2": """\
import torch
from transformers import Swinv2Config, Swinv2Model

torch.manual_seed(0)
model = Swinv2Model(Swinv2Config(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2],
                                 window_size=4)).eval()
example_inputs = {"pixel_values": torch.randn(2, 3, 32, 32)}
""",
    "llava": """\
import torch
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

torch.manual_seed(0)
config = LlavaConfig(
    vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                   image_size=32, patch_size=8, projection_dim=32),
    text_config=LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64),
    image_token_index=127, vision_feature_layer=-1)
model = LlavaForConditionalGeneration(config).eval()
ids = torch.randint(0, 120, (2, 24))
ids[:, 1:17] = 127  # one image token a patch (16 patches of 8x8 in a 32x32 image)
example_inputs = {"input_ids": ids, "pixel_values": torch.randn(2, 3, 32, 32)}
""",
    "dit_block": (ROOT / "tests" / "models" / "dit_block.py").read_text(),
    "dlrm": """\
import torch
from torch import nn


class DLRM(nn.Module):
    # dense features through a bottom MLP, sparse ones through embedding bags, pairwise dot interactions, top MLP
    def __init__(self, tables=(1000, 500, 200), dim=16):
        super().__init__()
        self.bottom = nn.Sequential(nn.Linear(13, 64), nn.ReLU(), nn.Linear(64, dim), nn.ReLU())
        self.embeddings = nn.ModuleList(nn.EmbeddingBag(n, dim, mode="sum") for n in tables)
        pairs = (len(tables) + 1) * len(tables) // 2
        self.top = nn.Sequential(nn.Linear(dim + pairs, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense, sparse, offsets):
        x = self.bottom(dense)
        features = [x] + [bag(sparse[i], offsets[i]) for i, bag in enumerate(self.embeddings)]
        z = torch.stack(features, dim=1)
        dots = torch.bmm(z, z.transpose(1, 2))
        i, j = torch.triu_indices(z.shape[1], z.shape[1], offset=1)
        return torch.sigmoid(self.top(torch.cat([x, dots[:, i, j]], dim=1)))


torch.manual_seed(0)
model = DLRM().eval()
batch, per_bag = 16, 4
example_inputs = (torch.randn(batch, 13),
                  torch.stack([torch.randint(0, n, (batch * per_bag,)) for n in (1000, 500, 200)]),
                  torch.arange(0, batch * per_bag, per_bag).repeat(3, 1))
""",
    "custom_function": """\
import torch
from torch import nn


class ScaledTanh(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        y = torch.tanh(x * scale)
        ctx.save_for_backward(y)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * ctx.scale * (1 - y * y), None


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(32, 64)
        self.b = nn.Linear(64, 8)

    def forward(self, x):
        return self.b(ScaledTanh.apply(self.a(x), 0.5))


torch.manual_seed(0)
model = Net().eval()
example_inputs = (torch.randn(8, 32),)
""",
    "reparametrised": """\
import torch
from torch import nn
from torch.nn.utils import parametrizations


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = parametrizations.weight_norm(nn.Conv1d(8, 32, 5, padding=2))
        self.fc = parametrizations.spectral_norm(nn.Linear(32, 16))

    def forward(self, x):
        return self.fc(torch.relu(self.conv(x)).mean(-1))


torch.manual_seed(0)
model = Net().eval()
example_inputs = (torch.randn(4, 8, 64),)
""",
    "graph_transformer": """\
import torch
from torch import nn


class GraphAttention(nn.Module):
    # attention restricted to a graph's edges (an additive -inf mask), with edge features as attention biases
    def __init__(self, width=32, heads=4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.edge_bias = nn.Linear(4, heads)
        self.out = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x, adjacency, edges):
        b, n, w = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, n, 3, self.heads, w // self.heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / (w // self.heads) ** 0.5 + self.edge_bias(edges).permute(0, 3, 1, 2)
        scores = scores.masked_fill(~adjacency[:, None], float("-inf"))
        return x + self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, n, w))


class GraphTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, 32)
        self.layers = nn.ModuleList(GraphAttention() for _ in range(2))
        self.readout = nn.Linear(32, 1)

    def forward(self, nodes, adjacency, edges):
        x = self.embed(nodes)
        for layer in self.layers:
            x = layer(x, adjacency, edges)
        return self.readout(x.mean(1))


torch.manual_seed(0)
model = GraphTransformer().eval()
adjacency = (torch.rand(4, 20, 20) < 0.2) | torch.eye(20, dtype=torch.bool)
example_inputs = (torch.randn(4, 20, 8), adjacency, torch.randn(4, 20, 20, 4))
""",
}
MODELS.update(MORE_MODELS)

# Hand-written recurrences that store their state in place and return it (the pattern of RWKV's state):
# one tensor overwritten every step (torch.fx traces it), a slot per step read back by the next, and a
# state the caller passes (tests/models/state_in_place.py, which the tests read too).
_STATE_LOOPS = (ROOT / "tests" / "models" / "state_in_place.py").read_text()
STATE_MODELS: Dict[str, str] = {
    f"state_{name}": _STATE_LOOPS + f"\nmodel, example_inputs = build({name!r})\n"
    for name in ("copy", "slots", "given")
}
MODELS.update(STATE_MODELS)

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


WITHIN = 3.0
FLOOR = 2.0**-17.5  # float32's own rounding: below it neither figure is compared (as the probe compares them)


def _accuracy(models: Dict) -> Dict:
    """Per output and precision: is the prediction within 3x of the measurement? (Issue 39's acceptance.)"""
    pairs, outside = 0, []
    for name, entry in models.items():
        for mode, figures in (entry["now"].get("modes") or {}).items():
            each = figures.get("outputs") or [dict(figures, output="output")]
            for row in each:
                if row.get("predicted") is None or row.get("measured") is None:
                    continue
                p, m = max(row["predicted"], FLOOR), max(row["measured"], FLOOR)
                pairs += 1
                if max(p / m, m / p) > WITHIN:
                    outside.append({"model": name, "mode": mode, "output": row["output"],
                                    "predicted": row["predicted"], "measured": row["measured"]})
    return {"pairs": pairs, "within_3x": pairs - len(outside), "outside_3x": outside}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", default="all", help="comma-separated names, 'all' (default), 'more' (the "
                        "families beyond the model classes) or 'state' (loops that store their state in place)")
    parser.add_argument("--before", help="another checkout's root: its preclint checks each model too")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    names = {"all": list(MODELS), "more": list(MORE_MODELS), "state": list(STATE_MODELS)}.get(args.models) \
        or args.models.split(",")
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
    result["summary"].update(_accuracy(now))
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
