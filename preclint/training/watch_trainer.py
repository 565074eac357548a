"""``preclint.watch.TrainerCallback``: the monitor in transformers' Trainer. The class is made on first use,
on transformers.TrainerCallback, so that preclint imports without transformers.

    trainer = Trainer(model, args, ..., callbacks=[preclint.watch.TrainerCallback(every=100, path="p.jsonl")])

It starts a Watch on the Trainer's model and optimizer when training begins and closes it, printing the
summary, when training ends. The Trainer's GradScaler lives in accelerate, out of a callback's reach: give it
as ``scaler=trainer.accelerator.scaler`` to have skipped steps counted with their cause.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

from preclint.training.watch import DEFAULT_EVERY, Watch


@functools.lru_cache(maxsize=1)
def trainer_callback() -> type:
    try:
        import transformers  # optional: only this callback needs it
    except ImportError as error:
        raise ImportError("preclint.watch.TrainerCallback needs transformers (pip install transformers)") from error

    class TrainerCallback(transformers.TrainerCallback):
        """Watches a Trainer's run (preclint.watch's arguments, less the model and optimizer)."""

        def __init__(self, every: int = DEFAULT_EVERY, path: Optional[str] = None, scaled: Any = None,
                     scaler: Any = None, summary: bool = True, *, recipe: Any = None) -> None:
            self.every, self.path, self.scaled, self.scaler, self.print = every, path, scaled, scaler, summary
            self.recipe = recipe
            self.watch: Optional[Watch] = None

        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            if model is None or optimizer is None:
                return
            self.watch = Watch(model, optimizer, scaler=self.scaler, every=self.every, path=self.path,
                               scaled=self.scaled, recipe=self.recipe).start()

        def on_train_end(self, args, state, control, **kwargs):
            if self.watch is not None:
                self.watch.close()
                if self.print:
                    self.watch.print_summary()

    return TrainerCallback
