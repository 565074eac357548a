"""A CLIP-like model with three outputs, as OpenCLIP's forward returns them: unit-norm image and
text features (RMS about 0.18) and the logit scale (about 14, the exp of a parameter)."""
import math

import torch
import torch.nn.functional as F
from torch import nn


class Tower(nn.Module):
    def __init__(self, d_in, d):
        super().__init__()
        self.proj = nn.Linear(d_in, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        x = self.proj(x)
        return x + self.mlp(x)


class TwoTowers(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.visual = Tower(48, 32)
        self.text = Tower(24, 32)
        self.logit_scale = nn.Parameter(torch.ones([]) * math.log(1 / 0.07))

    def forward(self, image, text):
        image_features = F.normalize(self.visual(image), dim=-1)
        text_features = F.normalize(self.text(text), dim=-1)
        return image_features, text_features, self.logit_scale.exp()


model = TwoTowers()
torch.manual_seed(1)
example_inputs = (torch.randn(4, 48), torch.randn(4, 24))
