"""What train mode does to a compared output: a model called in train mode computes with batch
statistics (BatchNorm normalises by the batch's mean and variance, not its running ones) and draws
dropout masks, so its outputs are those of another function than in eval mode, and with dropout
another on every call.

``train_mode_effect`` answers by running float32 copies of the model in the mode it was called in
(twice: do they agree?) and in eval mode (does the mode change the output?); the model itself, its
buffers and the process's random state are left as they were.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from preclint.measure.compare import LARGEST, relative_rms
from preclint.capture.global_state import preserved
from preclint.load.modelio import output_leaves

# modules whose train mode changes what they compute: named in the explanation
BATCH_STATISTICS = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.instancenorm._InstanceNorm)
RANDOM = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d, torch.nn.AlphaDropout,
          torch.nn.FeatureAlphaDropout)


@dataclass(frozen=True)
class TrainModeEffect:
    """How train mode changes a model's float32 output on the test's inputs."""

    random: bool  # two runs in train mode differ: dropout (or other randomness) is active
    spread: float  # RMS of their difference relative to the output's RMS (0 where they agree)
    batch_statistics: Tuple[str, ...]  # the modules in train mode that normalise by the batch's statistics
    random_modules: Tuple[str, ...]  # the dropout modules in train mode with p > 0

    def layers(self) -> str:
        names = self.random_modules if self.random else self.batch_statistics
        shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
        return f" ({shown})" if shown else ""


def in_train_mode(model: torch.nn.Module) -> bool:
    return any(m.training for m in model.modules())


def train_mode_effect(model: torch.nn.Module, inputs) -> Optional[TrainModeEffect]:
    """The effect of the train mode ``model`` is in on its float32 output for ``inputs`` (Inputs), or
    None where it is in eval mode or its mode changes nothing."""
    if not in_train_mode(model):
        return None
    from preclint.measure.copies import copy_to  # lazy: the plain check loads no probe/measure/plan

    def run(evaluating: bool):
        copy = copy_to(model, None, torch.float32)
        if evaluating:
            copy.eval()
        with torch.no_grad(), _no_autocast():
            output = inputs.call(copy)
        return [t.detach().to("cpu", torch.float64) for _, t in output_leaves(output)
                if isinstance(t, torch.Tensor) and t.is_floating_point()]

    devices = [p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"][:1]
    with preserved(), torch.random.fork_rng(devices=devices):
        first, second = run(False), run(False)
        spread = _relative(first, second)
        random = spread != 0.0
        changed = random or _relative(first, run(True)) != 0.0
    if not changed:
        return None
    return TrainModeEffect(random, spread, _named(model, BATCH_STATISTICS, lambda m: True),
                           _named(model, RANDOM, lambda m: float(getattr(m, "p", 0.0)) > 0))


def not_deterministic_text(precision: str, why: str, effect: TrainModeEffect) -> str:
    """What a failed comparison of a model with dropout active says: two random draws compared."""
    return (f"preclint: output computed under {precision} ({why}); the model was called in train mode with dropout "
            f"active{effect.layers()}: two float32 runs of it differ by {effect.spread:.3g} of the output's RMS.\n"
            f"  The comparison is not deterministic: it compares two random draws, and says nothing about {precision}: "
            "neither a precision difference nor a change can be told. Compare the model in eval mode (model.eval()), "
            "or with the same random draws in both runs.")


def _named(model: torch.nn.Module, kinds, active) -> Tuple[str, ...]:
    return tuple(f"{name or type(model).__name__} ({type(m).__name__})" for name, m in model.named_modules()
                 if isinstance(m, kinds) and m.training and active(m))


def _relative(a, b) -> float:
    """RMS of the difference of two runs' outputs over the RMS of the first's (inf where they differ in
    structure or in which values are inf/NaN)."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return math.inf
    found = relative_rms(b, a, nonfinite=LARGEST)
    if found is None:
        # nothing to compare agrees; outputs of zeros against other values have no scale: as far apart as can be
        return math.inf if any(bool((x != y).any()) for x, y in zip(a, b)) else 0.0
    return found


@contextlib.contextmanager
def _no_autocast():
    with contextlib.ExitStack() as stack:
        for device in ("cpu", "cuda"):
            try:
                stack.enter_context(torch.autocast(device, enabled=False))
            except (RuntimeError, AssertionError):  # a device type this torch has no autocast for
                pass
        yield

