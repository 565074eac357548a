"""Training-step numerics: the statistics of gradients, updates and optimizer state under a storage format
(``statistics``), which the reference step, the error model, the probe and a monitor inside a training loop
all compute the same way; and that monitor, ``preclint.watch`` (``watch_entry``: the monitor in ``watch``, a
sampled step's hooks in ``watch_record``, the reduction across ranks in ``watch_reduce``, transformers'
callback in ``watch_trainer``, Lightning's in ``watch_lightning``). Torch only: nothing here reads the IR or the rules."""
