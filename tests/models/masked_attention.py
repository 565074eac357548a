"""Attention masked as Gemma2 masks it: ``torch.where(causal, scores, torch.finfo(dtype).min)``. The
fill is -1.8e308 in the probe's float64 reference and -3.4e38 in a float32 run; softmax gives the
masked positions zero weight in both."""
import torch
from torch import nn


class MaskedAttention(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        torch.manual_seed(0)
        self.qkv = nn.Linear(d, 3 * d)
        self.scale = d ** -0.5

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(-1, -2) * self.scale
        n = x.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        scores = torch.where(causal, scores, torch.finfo(scores.dtype).min)
        return scores.softmax(dim=-1) @ v


model = MaskedAttention()
example_inputs = (torch.randn(1, 12, 32),)
