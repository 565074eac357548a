import torch
from torch import nn


class FNO1d(nn.Module):
    """A one-layer Fourier neural operator whose forward builds its grid on the CPU (no device=)."""

    def __init__(self, modes=8, width=16):
        super().__init__()
        self.modes = modes
        self.lift = nn.Linear(2, width)
        self.spectral = nn.Parameter(torch.randn(width, modes) / width ** 0.5)
        self.w = nn.Conv1d(width, width, 1)
        self.proj = nn.Linear(width, 1)

    def forward(self, x):  # (batch, points, 1)
        grid = torch.linspace(0, 1, x.shape[1]).reshape(1, -1, 1).repeat(x.shape[0], 1, 1)
        h = self.lift(torch.cat([x, grid], dim=-1)).permute(0, 2, 1)
        ft = torch.fft.rfft(h)
        out = torch.zeros_like(ft)
        out[..., :self.modes] = ft[..., :self.modes] * self.spectral
        h = torch.relu(torch.fft.irfft(out, n=h.shape[-1]) + self.w(h))
        return self.proj(h.permute(0, 2, 1))


torch.manual_seed(0)
model = FNO1d()
example_inputs = (torch.randn(4, 64, 1),)
