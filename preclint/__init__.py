"""preclint: a precision linter for PyTorch models."""

__version__ = "0.1.0"
