"""One activation instance shared by every block, as Ultralytics' ``Conv.default_act`` is; block 2's
convolution sits far in SiLU's negative tail, so what the shared SiLU makes there is below float16's
normal range while block 0's values are ordinary."""
import torch
from torch import nn


class Conv(nn.Module):
    default_act = nn.SiLU()  # one instance, registered under every Conv as its ``act``

    def __init__(self, c1, c2, shift=0.0):
        super().__init__()
        self.conv = nn.Conv2d(c1, c2, 3, padding=1)
        with torch.no_grad():
            self.conv.bias.fill_(shift)
        self.act = self.default_act

    def forward(self, x):
        return self.act(self.conv(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(Conv(3, 8), Conv(8, 8), Conv(8, 8, shift=-22.0), Conv(8, 8))

    def forward(self, x):
        return self.model(x)


model = Net()
example_inputs = (torch.randn(1, 3, 16, 16),)
