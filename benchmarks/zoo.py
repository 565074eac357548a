"""The models the accuracy benchmark predicts and measures: random init, seeded, nothing downloaded.

Each entry builds ``(module, inputs)`` on the CPU in float32. The same seed gives the same weights
on every machine with the same torch/torchvision init code; ``fingerprint`` lets a comparison
check that a measurement made elsewhere (the GPU machine) ran the very model predicted here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import nn


@dataclass(frozen=True)
class ZooModel:
    name: str
    family: str  # classification | segmentation | detection | transformer
    build: Callable[[], Tuple[nn.Module, tuple]]
    ranking: Optional[str] = None  # "cnn" or "transformer": part of the one-layer-at-a-time check
    decisions: bool = False  # the output is a decision (labels): the benchmark measures flip fractions
    mini: bool = False  # small enough for the test suite's mini run


def _seeded(fn):
    def build():
        torch.manual_seed(0)
        with _stable_trunc_normal():
            return fn()

    return build


class _stable_trunc_normal:
    """torch.nn.init.trunc_normal_ by inverse CDF of a uniform draw, as torch drew it up to 2.11 (newer
    torch draws by rejection): ViT, Swin and ConvNeXt then get the same weights on every torch
    version, so a measurement made on another machine compares with the prediction made here."""

    def __enter__(self):
        self.saved = torch.nn.init.trunc_normal_
        torch.nn.init.trunc_normal_ = _trunc_normal
        return self

    def __exit__(self, *exc):
        torch.nn.init.trunc_normal_ = self.saved


def _trunc_normal(tensor, mean=0.0, std=1.0, a=-2.0, b=2.0, generator=None):
    def cdf(x):
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    with torch.no_grad():
        low, high = cdf((a - mean) / std), cdf((b - mean) / std)
        tensor.uniform_(2 * low - 1, 2 * high - 1, generator=generator)
        tensor.erfinv_().mul_(std * math.sqrt(2.0)).add_(mean).clamp_(min=a, max=b)
    return tensor


def _torchvision(name: str, shape=(1, 3, 224, 224), **kwargs):
    @_seeded
    def build():
        import torchvision

        model = getattr(torchvision.models, name)(weights=None, **kwargs).eval()
        return model, (torch.rand(*shape),)

    return build


def _vit_b_16():
    @_seeded
    def build():
        import torchvision

        model = torchvision.models.vit_b_16(weights=None).eval()
        # torchvision zero-initialises the classifier, so the logits are exactly 0 and no relative error
        # can be measured; give it the init of an ordinary Linear instead.
        head = model.heads.head
        nn.init.kaiming_uniform_(head.weight, a=math.sqrt(5))
        nn.init.uniform_(head.bias, -1 / math.sqrt(head.in_features), 1 / math.sqrt(head.in_features))
        return model, (torch.rand(1, 3, 224, 224),)

    return build


def _segmentation(name: str, size: int = 224):
    @_seeded
    def build():
        import torchvision

        model = getattr(torchvision.models.segmentation, name)(weights=None, weights_backbone=None).eval()
        return _DictOut(model, "out"), (torch.rand(1, 3, size, size),)

    return build


class _DictOut(nn.Module):
    """Returns one entry of a model's output dict (torchvision segmentation models return {'out': ...})."""

    def __init__(self, model: nn.Module, key: str) -> None:
        super().__init__()
        self.model = model
        self.key = key

    def forward(self, x):
        return self.model(x)[self.key]


class _SegmentationLabels(nn.Module):
    """Per-pixel class labels: the decision a segmentation user compares."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)["out"].argmax(dim=1)


class _ClassLabels(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x).argmax(dim=-1)


class _RetinaNetHeads(nn.Module):
    """RetinaNet up to its head outputs (class logits and box regressions of every anchor).

    The detector's boxes pass through score thresholds, top-k and NMS, so elementwise errors of its
    final output are not defined; the head outputs are what those decisions read.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.backbone = model.backbone
        self.head = model.head

    def forward(self, x):
        features = list(self.backbone(x).values())
        out = self.head(features)
        return torch.cat([out["cls_logits"].flatten(1), out["bbox_regression"].flatten(1)], dim=1)


@_seeded
def _retinanet():
    import torchvision

    model = torchvision.models.detection.retinanet_resnet50_fpn(weights=None, weights_backbone=None).eval()
    return _RetinaNetHeads(model), (torch.rand(1, 3, 320, 320),)


@_seeded
def _lraspp_labels():
    import torchvision

    model = torchvision.models.segmentation.lraspp_mobilenet_v3_large(weights=None, weights_backbone=None).eval()
    return _SegmentationLabels(model), (torch.rand(2, 3, 224, 224),)


@_seeded
def _fcn_labels():
    import torchvision

    model = torchvision.models.segmentation.fcn_resnet50(weights=None, weights_backbone=None).eval()
    return _SegmentationLabels(model), (torch.rand(1, 3, 224, 224),)


@_seeded
def _resnet18_labels():
    import torchvision

    model = torchvision.models.resnet18(weights=None).eval()
    return _ClassLabels(model), (torch.rand(64, 3, 64, 64),)


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        causal = torch.ones_like(scores, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(causal, float("-inf"))
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(b, t, c)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small decoder-only language model: token and position embeddings, pre-LN blocks, tied-free head."""

    def __init__(self, vocab: int = 512, width: int = 256, depth: int = 4, heads: int = 4, context: int = 128) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(depth)])
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.tokens(ids) + self.positions(torch.arange(t, device=ids.device))
        return self.head(self.ln(self.blocks(x)))


@_seeded
def _tiny_gpt():
    model = TinyGPT().eval()
    return model, (torch.randint(0, 512, (2, 64)),)


@_seeded
def _mlp_block():
    """The mini run's transformer-style block: LayerNorm, MLP, residual."""
    model = nn.Sequential(Block(64, 4), Block(64, 4)).eval()
    return model, (torch.randn(2, 16, 64),)


ZOO: List[ZooModel] = [
    ZooModel("resnet18", "classification", _torchvision("resnet18"), ranking="cnn"),
    ZooModel("resnet50", "classification", _torchvision("resnet50"), ranking="cnn"),
    ZooModel("resnet101", "classification", _torchvision("resnet101")),
    ZooModel("resnext50_32x4d", "classification", _torchvision("resnext50_32x4d")),
    ZooModel("mobilenet_v3_large", "classification", _torchvision("mobilenet_v3_large"), ranking="cnn"),
    ZooModel("efficientnet_b0", "classification", _torchvision("efficientnet_b0")),
    ZooModel("convnext_tiny", "classification", _torchvision("convnext_tiny"), ranking="cnn"),
    ZooModel("regnet_y_400mf", "classification", _torchvision("regnet_y_400mf"), ranking="cnn"),
    ZooModel("vit_b_16", "transformer", _vit_b_16(), ranking="transformer"),
    ZooModel("swin_t", "transformer", _torchvision("swin_t")),
    ZooModel("fcn_resnet50", "segmentation", _segmentation("fcn_resnet50")),
    ZooModel("deeplabv3_mobilenet_v3_large", "segmentation", _segmentation("deeplabv3_mobilenet_v3_large")),
    ZooModel("retinanet_resnet50_fpn_heads", "detection", _retinanet),
    ZooModel("tiny_gpt", "transformer", _tiny_gpt, ranking="transformer", mini=True),
    ZooModel("lraspp_labels", "segmentation", _lraspp_labels, decisions=True),
    ZooModel("fcn_resnet50_labels", "segmentation", _fcn_labels, decisions=True),
    ZooModel("resnet18_labels", "classification", _resnet18_labels, decisions=True),
    ZooModel("mlp_block", "transformer", _mlp_block, mini=True),
]

BY_NAME: Dict[str, ZooModel] = {m.name: m for m in ZOO}


def fingerprint(module: nn.Module, inputs: tuple) -> str:
    """A short digest of the weights and inputs, equal wherever the same model was built."""
    total = 0.0
    weighted = 0.0
    i = 0
    with torch.no_grad():
        for t in list(module.state_dict().values()) + [v for v in inputs if isinstance(v, torch.Tensor)]:
            if not isinstance(t, torch.Tensor) or t.numel() == 0:
                continue
            t = t.detach().double().flatten()
            i += 1
            total += float(t.sum())
            weighted += float(t[: 1024].sum()) * i
    return f"{total:.10e}/{weighted:.10e}"


def same_fingerprint(a: str, b: str) -> bool:
    """Whether two fingerprints name the same model: equal to 1e-9 relative. The sums are float64,
    but their order follows the thread count (a parallel reduction over 28M weights moves the 11th
    digit), so two machines, or one at two thread counts, do not print every digit alike."""
    try:
        pairs = list(zip((float(x) for x in a.split("/")), (float(y) for y in b.split("/"))))
    except ValueError:
        return a == b
    return len(pairs) == 2 and all(abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1e-30) for x, y in pairs)
