"""Hand-written recurrences that store their state in place and return it (the pattern of transformers'
RWKV state): one tensor overwritten every step (torch.fx traces it), a slot per step read back by the
next, and a state the caller passes. This file's ``model`` is the first; ``build(name)`` makes any.
"""
import torch
from torch import nn

STEPS, WIDTH = 12, 16


class Cell(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, WIDTH)
        self.rec = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, 4)

    def step(self, x, h):
        return torch.tanh(self.inp(x) + self.rec(h))


class Copied(Cell):
    """The state is one tensor that every step overwrites (torch.fx traces it)."""

    def forward(self, x):
        state = x.new_zeros(x.shape[0], WIDTH)
        for i in range(STEPS):
            state.copy_(self.step(x[:, i], state))
        return self.head(state), state


class Slots(Cell):
    """Each step reads its state from the slot the step before wrote (``states[:, i + 1] = h``)."""

    def forward(self, x):
        states = torch.zeros(x.shape[0], STEPS + 1, WIDTH)
        for i in range(STEPS):
            states[:, i + 1] = self.step(x[:, i], states[:, i])
        return self.head(states[:, -1]), states


class Given(Cell):
    """The caller passes the state, which the forward stores into (``state[:, 0] = h``)."""

    def forward(self, x, state):
        for i in range(STEPS):
            state[:, 0] = self.step(x[:, i], state[:, 0])
        return self.head(state[:, 0]), state


LOOPS = {
    "copy": (Copied, lambda: (torch.randn(4, STEPS, 8),)),
    "slots": (Slots, lambda: (torch.randn(4, STEPS, 8),)),
    "given": (Given, lambda: (torch.randn(4, STEPS, 8), torch.zeros(4, 1, WIDTH))),
}



def build(name: str):
    """(model, example inputs) of loop ``name``, from seed 0."""
    cls, inputs = LOOPS[name]
    torch.manual_seed(0)
    return cls().eval(), inputs()


model, example_inputs = build("copy")
