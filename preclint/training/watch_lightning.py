"""``preclint.watch.LightningCallback``: the monitor in PyTorch Lightning's Trainer. The class is made on first
use, on ``lightning.pytorch.Callback`` (or ``pytorch_lightning.Callback``), so that preclint imports without
Lightning.

    trainer = lightning.Trainer(precision="16-mixed",
                                callbacks=[preclint.watch.LightningCallback(every=100, path="p.jsonl")])

It starts a Watch on the LightningModule and the Trainer's (first) optimizer when training starts and closes
it, printing the summary, when training ends (or fails). The GradScaler of the precision plugin
(``precision="16-mixed"``) is watched for skipped steps.

Lightning runs the forward and backward inside ``optimizer.step(closure)`` where no GradScaler steps, so the
optimizer's pre-step hook comes before the gradients exist: the step is sampled from the start of its batch
(``on_train_batch_start``), and the gradients are read at ``on_before_optimizer_step``, after the backward and
GradScaler's unscale and before gradient clipping, as Lightning calls it with and without a scaler.
"""
from __future__ import annotations

import functools
from typing import Any, List, Optional

from preclint.training.watch import DEFAULT_EVERY, Watch


class LightningWatch(Watch):
    """A Watch whose step is announced by a Lightning callback (see the module's docstring)."""

    def _step_hooks(self) -> List[Any]:
        return [self.optimizer.register_step_post_hook(self._post_step)]

    def batch_starts(self) -> None:
        """A training batch starts: on a sampled step, hook every module before its forward runs."""
        if self._recorder is None and self._handles and self._sampling():
            self._sample()

    def gradients_ready(self) -> None:
        """The step's gradients are final (and unscaled): what the pre-step hook does in a plain loop."""
        if self._handles:
            self._pre_step(self.optimizer, (), {})

    def _post_step(self, optimizer, args, kwargs) -> None:
        self._stepped = True  # the step ran: GradScaler did not skip it
        super()._post_step(optimizer, args, kwargs)


def _lightning() -> Any:
    """``lightning.pytorch``, else ``pytorch_lightning``."""
    try:
        import lightning.pytorch as pl  # optional: only this callback needs it
    except ImportError:
        try:
            import pytorch_lightning as pl
        except ImportError as error:
            raise ImportError("preclint.watch.LightningCallback needs PyTorch Lightning (pip install lightning)") \
                from error
    return pl


@functools.lru_cache(maxsize=1)
def lightning_callback() -> type:
    pl = _lightning()

    class LightningCallback(pl.Callback):
        """Watches a Lightning Trainer's fit (preclint.watch's arguments, less the model, optimizer and
        scaler); ``summary``: print the summary when training ends. ``preclint.watch_report(path or
        callback.watch.records, "p.html")`` draws the charts."""

        def __init__(self, every: int = DEFAULT_EVERY, path: Optional[str] = None, scaled: Any = None,
                     summary: bool = True, *, recipe: Any = None) -> None:
            if not isinstance(every, int) or every < 1:
                raise ValueError(f"preclint.watch.LightningCallback: every={every!r}; give a whole number of steps, "
                                 "1 or more")
            self.every, self.path, self.scaled, self.print, self.recipe = every, path, scaled, summary, recipe
            self.watch: Optional[LightningWatch] = None

        def on_train_start(self, trainer, pl_module) -> None:
            if not trainer.optimizers:
                return
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            self.watch = LightningWatch(pl_module, trainer.optimizers[0], scaler=scaler, every=self.every,
                                        path=self.path, scaled=self.scaled, recipe=self.recipe).start()

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if self.watch is not None:
                self.watch.batch_starts()

        def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
            if self.watch is not None and getattr(optimizer, "optimizer", optimizer) is self.watch.optimizer:
                self.watch.gradients_ready()

        def on_train_end(self, trainer, pl_module) -> None:
            self._close()

        def on_exception(self, trainer, pl_module, exception) -> None:
            self._close()

        def _close(self) -> None:
            if self.watch is None or not self.watch._handles:
                return
            self.watch.close()
            if self.print:
                self.watch.print_summary()

    # a name pickle can find (the module's __getattr__ below): ddp_spawn pickles the Trainer's callbacks
    LightningCallback.__qualname__ = "LightningCallback"
    return LightningCallback


def __getattr__(name: str) -> Any:
    if name == "LightningCallback":
        return lightning_callback()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
