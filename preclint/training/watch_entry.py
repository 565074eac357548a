"""``preclint.watch``: ``preclint.watch(model, optimizer, ...)`` makes a Watch (watch.py);
``preclint.watch.TrainerCallback`` is the callback for transformers' Trainer (watch_trainer.py),
``preclint.watch.LightningCallback`` the one for PyTorch Lightning's (watch_lightning.py)."""
from __future__ import annotations

from typing import Any, Optional

import torch

from preclint.training.watch import DEFAULT_EVERY, Watch
from preclint.training.watch_lightning import lightning_callback
from preclint.training.watch_trainer import trainer_callback


class _Entry:
    """``preclint.watch(model, optimizer, scaler=None, every=100, path=None, scaled=None, recipe=None)``: a Watch of the
    training loop it wraps (``with preclint.watch(...) as w:``), writing one JSON line a sampled step to
    ``path``; ``preclint.watch.TrainerCallback(every=..., path=...)`` is the callback for transformers'
    Trainer and ``preclint.watch.LightningCallback(every=..., path=...)`` Lightning's (each made on first use:
    transformers and Lightning are optional). docs/training.md, "Watching a training run"."""

    def __call__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any = None,
                 every: int = DEFAULT_EVERY, path: Optional[str] = None, scaled: Any = None, *,
                 recipe: Any = None) -> Watch:
        return Watch(model, optimizer, scaler=scaler, every=every, path=path, scaled=scaled, recipe=recipe)

    def __getattr__(self, name: str):
        if name == "TrainerCallback":
            return trainer_callback()
        if name == "LightningCallback":
            return lightning_callback()
        raise AttributeError(f"preclint.watch has no attribute {name!r}")


watch = _Entry()
