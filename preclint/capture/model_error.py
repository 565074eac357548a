"""The error that says the model itself raised on its example inputs, as opposed to a capture path
that could not handle the model."""
from __future__ import annotations

from preclint.core.errors import one_line


class ModelRunError(Exception):
    """The model itself raised while running on the example inputs (not a capture problem)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(one_line(cause))
        self.cause = cause
