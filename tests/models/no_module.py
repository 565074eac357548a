"""Imports nn.Module subclasses but defines none, so there is no model to find."""

from torch.nn import Linear, ReLU  # noqa: F401  (imported classes are not candidates)

WIDTH = 4
