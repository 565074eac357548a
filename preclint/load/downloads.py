"""No downloads: torch.hub refuses to fetch anything while the user's code runs."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.hub


class DownloadRefused(Exception):
    """Raised in place of a torch.hub download; its message is the whole explanation."""


@contextlib.contextmanager
def downloads_refused() -> Iterator[None]:
    """Make torch.hub downloads fail while user code runs.

    preclint never downloads weights, yet some zero-argument factories do by default
    (torchvision's detection models fetch their backbone's ImageNet weights). torch.hub's
    load_state_dict_from_url and hub.load both fetch through this one module-level function.
    Files already in the torch.hub cache still load: that is not a download.
    """

    def refuse(url: str, *args: object, **kwargs: object) -> None:
        raise DownloadRefused(
            f"it tried to download {url}; preclint never downloads weights: build the model "
            "without pretrained weights (torchvision: weights=None, weights_backbone=None) in a "
            "zero-argument factory, or pass a local checkpoint with --weights"
        )

    original = torch.hub.download_url_to_file
    torch.hub.download_url_to_file = refuse
    try:
        yield
    finally:
        torch.hub.download_url_to_file = original
