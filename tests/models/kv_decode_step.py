"""A hand-written decode step of a one-layer attention language model with a KV cache: the new token
attends over the cached keys and values; the step returns its logits and the caches grown by one row."""
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
