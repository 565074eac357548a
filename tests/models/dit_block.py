"""Two blocks of a diffusion transformer (DiT): adaLN modulation from a timestep embedding scales and
shifts the normalised tokens before attention and the MLP."""
import torch
from torch import nn


class DiTBlock(nn.Module):
    # adaLN-zero modulation as in DiT: the timestep embedding scales and shifts each sublayer
    def __init__(self, width=64, heads=4):
        super().__init__()
        self.norm1 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width, elementwise_affine=False, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
        self.modulation = nn.Sequential(nn.SiLU(), nn.Linear(width, 6 * width))

    def forward(self, x, c):
        shift1, scale1, gate1, shift2, scale2, gate2 = self.modulation(c).unsqueeze(1).chunk(6, dim=-1)
        h = self.norm1(x) * (1 + scale1) + shift1
        x = x + gate1 * self.attn(h, h, h, need_weights=False)[0]
        h = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(h)


class DiT(nn.Module):
    def __init__(self, width=64, depth=2, patch=4):
        super().__init__()
        self.embed = nn.Conv2d(4, width, patch, stride=patch)
        self.time = nn.Sequential(nn.Linear(1, width), nn.SiLU(), nn.Linear(width, width))
        self.blocks = nn.ModuleList(DiTBlock(width) for _ in range(depth))
        self.out = nn.Linear(width, patch * patch * 4)

    def forward(self, latent, t):
        x = self.embed(latent).flatten(2).transpose(1, 2)
        c = self.time(t[:, None])
        for block in self.blocks:
            x = block(x, c)
        return self.out(x)


torch.manual_seed(0)
model = DiT().eval()
for block in model.blocks:  # trained DiTs have left adaLN-zero's zero start
    nn.init.normal_(block.modulation[1].weight, std=0.05)
example_inputs = (torch.randn(2, 4, 16, 16), torch.rand(2) * 1000)
