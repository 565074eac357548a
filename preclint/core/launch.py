"""Whether a launcher (torchrun) started this process among others, read from the environment
without importing the probe's distributed machinery (probe/distributed.py), which a check does not use."""
from __future__ import annotations

import os


def launched() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE) started this process among others."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False
