"""``preclint.watch``: a monitor of precision health inside a user's own training loop (docs/training.md,
"Watching a training run").

    with preclint.watch(model, optimizer, scaler=scaler, every=100, path="precision.jsonl") as w:
        for batch in loader:
            ...                      # the loop as it is: forward, backward, (scaler.)step, zero_grad

It hooks ``optimizer.step`` (pre and post hooks) and, on every ``every``-th step only, every module's
forward and output gradient (watch_record.py); between samples a step costs two Python calls. A GradScaler's
skipped steps are counted on every step, with the parameters whose gradient was inf/NaN, and the step after a
skip or a non-finite value is sampled too (one process only: under torch.distributed every rank samples the
same steps). Each sampled step writes one JSON line; ``summary()`` totals them.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any, Dict, List, Optional

import torch

from preclint.training.watch_record import LayerCounts, StepRecorder, scaled_paths
from preclint.training.watch_reduce import gather_record, is_distributed, rank
from preclint.training.watch_scaled import AmaxHistory, LayerRecipe, declares_recipe, layer_recipe, parse_recipe

DEFAULT_EVERY = 100  # benchmarks/watch_overhead.py: a sampled step costs 1 to 3 ordinary ones on the CPU
SCHEMA = 1
JUMPS_LISTED = 64  # a record's amax jumps listed (amax_jump_count counts them all)


class Watch:
    """The monitor (``preclint.watch(...)`` makes one): a context manager, or ``start()``/``close()``."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scaler: Any = None,
                 every: int = DEFAULT_EVERY, path: Optional[str] = None, scaled: Any = None, *,
                 recipe: Any = None) -> None:
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"preclint.watch: every={every!r}; give a whole number of steps, 1 or more")
        self.model, self.scaler, self.every, self.path, self.scaled = model, scaler, every, path, scaled
        self.recipe = parse_recipe(recipe)  # the scaled layers' recipe, where a layer does not name its own
        self.recipes: Dict[str, LayerRecipe] = {}
        self._history: Optional[AmaxHistory] = None
        self._jump_total = 0
        self.optimizer = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps one
        self.records: List[Dict[str, Any]] = []
        self.step = 0  # optimizer steps taken or skipped so far
        self._recorder: Optional[StepRecorder] = None
        self._before: Dict[str, torch.Tensor] = {}
        self._armed = False
        self._stepped = False
        self._skips: List[Dict[str, Any]] = []  # skips since the last record
        self._skip_total = 0
        self._handles: List[Any] = []
        self._file = None
        self._named = []

    # -- installing ---------------------------------------------------------------------------------------
    def start(self) -> "Watch":
        if self._handles:
            return self
        self._named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        modules = dict(self.model.named_modules())
        paths = set(scaled_paths(self.model, self.scaled)) | {p for p, m in modules.items() if declares_recipe(m)}
        found = {path: layer_recipe(modules[path], self.recipe) for path in sorted(paths)}
        self.recipes = {path: r for path, r in found.items() if r is not None}
        if any(r.delayed for r in self.recipes.values()):  # hooks on every step, on these layers only
            self._history = AmaxHistory(self.model, self.recipes, lambda: self.step)
        self._handles = self._step_hooks() + [self.model.register_forward_pre_hook(self._on_forward)]
        if self.scaler is not None and getattr(self.scaler, "is_enabled", lambda: True)():
            original = self.scaler.step  # a bound method: the instance attribute below shadows it until close()

            def step(optimizer, *args, **kwargs):
                self._stepped = False
                out = original(optimizer, *args, **kwargs)
                if not self._stepped and getattr(optimizer, "optimizer", optimizer) is self.optimizer:
                    self._on_skip()  # the scaler did not step the watched optimizer (another's is not ours)
                return out

            self.scaler.step = step
        if self.path is not None and rank() == 0:
            self._file = open(self.path, "w", encoding="utf-8")
        return self

    def _step_hooks(self) -> List[Any]:
        """The optimizer's hooks: before its step (the gradients are final) and after it."""
        return [self.optimizer.register_step_pre_hook(self._pre_step),
                self.optimizer.register_step_post_hook(self._post_step)]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self.scaler is not None and "step" in vars(self.scaler):
            del self.scaler.step
        if self._recorder is not None:
            self._recorder.close()
            self._recorder = None
        if self._history is not None:
            self._history.close()
            self._history = None
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Watch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the hooks ----------------------------------------------------------------------------------------
    def _sampling(self) -> bool:
        return self.step % self.every == 0 or (self._armed and not is_distributed())

    def _on_forward(self, module, args) -> None:
        if self._recorder is None and torch.is_grad_enabled() and self._sampling():
            self._sample()

    def _sample(self) -> None:
        """Hook every module for this step (and have the amax history hand it the step's figures)."""
        self._recorder = StepRecorder(self.model, self.scaled, self.recipes)
        if self._history is not None:
            self._history.sampled = self._recorder.delayed(self.recipes)

    def _pre_step(self, optimizer, args, kwargs) -> None:
        self._stepped = True
        if self._recorder is None and self._sampling():  # a step whose forward ran outside the model's call
            self._sample()
        if self._recorder is not None:
            self._before = self._recorder.before_step(self._named)

    def _post_step(self, optimizer, args, kwargs) -> None:
        if self._recorder is not None:
            self._recorder.after_step(self._named, self._before)
            self._before = {}
            self._finish(skipped=False)
        self.step += 1

    def _on_skip(self) -> None:
        """GradScaler found an inf/NaN gradient and did not step: which parameters had one."""
        flags = [(name, ~torch.isfinite(p.grad).all()) for name, p in reversed(self._named) if p.grad is not None]
        nonfinite = torch.stack([flag.cpu() for _, flag in flags]).tolist() if flags else []
        causes = [name for (name, _), bad in zip(flags, nonfinite) if bad]  # in the order backward reaches them
        self._skip_total += 1
        self._skips.append(dict(step=self.step, scale=self._scale(), parameters=causes[:8],
                                nonfinite_parameters=len(causes)))
        if self._recorder is not None:
            self._finish(skipped=True)
        self._armed = True
        self.step += 1

    def _scale(self) -> Optional[float]:
        if self.scaler is None or not getattr(self.scaler, "is_enabled", lambda: True)():
            return None
        return float(self.scaler.get_scale())

    # -- records ------------------------------------------------------------------------------------------
    def _finish(self, skipped: bool) -> None:
        recorder, self._recorder = self._recorder, None
        recorder.close()
        recorder.settle()
        jumps = []
        if self._history is not None:
            self._history.sampled = None
            jumps = self._history.jumps()
            self._jump_total += len(jumps)
        if skipped:
            recorder.nonfinite_gradients = list(self._skips[-1]["parameters"]) if self._skips else []
        record = dict(schema=SCHEMA, step=self.step, skipped=skipped, scale=self._scale(), autocast=recorder.autocast,
                      skips=self._skips, layers={path: counts for path, counts in recorder.layers.items()},
                      first_nonfinite_forward=recorder.first_nonfinite_forward,
                      first_nonfinite_backward=recorder.first_nonfinite_backward,
                      first_nonfinite_update=recorder.first_nonfinite_update,
                      nonfinite_gradients=recorder.nonfinite_gradients[:8],
                      amax_jumps=jumps[:JUMPS_LISTED], amax_jump_count=len(jumps))
        self._skips = []
        record = gather_record(record)
        self._armed = bool(skipped or record["first_nonfinite_forward"] or record["first_nonfinite_backward"]
                           or record["first_nonfinite_update"])
        if rank() != 0:
            return
        out = _json_record(record)
        self.records.append(out)
        if self._file is not None:
            self._file.write(json.dumps(out, sort_keys=True, allow_nan=False) + "\n")
            self._file.flush()

    def summary(self) -> Dict[str, Any]:
        """Totals over the sampled steps: per layer the flushed gradients and lost updates, the skips, and
        the first step with a non-finite value."""
        layers: Dict[str, LayerCounts] = {}
        for record in self.records:
            for path, figures in record["layers"].items():
                counts = LayerCounts(**{k: v for k, v in figures.items()
                                        if k in LayerCounts.__dataclass_fields__ and k != "blocks"})
                layers.setdefault(path, LayerCounts()).add(counts)
        total = LayerCounts()
        for counts in layers.values():
            total.add(counts.counts_only())
        first = next((r for r in self.records if r["first_nonfinite_forward"] or r["first_nonfinite_backward"]
                      or r["first_nonfinite_update"]), None)
        return dict(steps=self.step, sampled_steps=len(self.records), skipped_steps=self._skip_total,
                    amax_jumps=self._jump_total,
                    underflow_fraction=total.as_json()["underflow_fraction"],
                    lost_update_fraction=total.as_json()["lost_update_fraction"],
                    zero_gradient_fraction=total.as_json()["zero_gradient_fraction"],
                    nonfinite_updates=total.nonfinite_updates,
                    first_nonfinite=None if first is None else {
                        k: first[k] for k in ("step", "first_nonfinite_forward", "first_nonfinite_backward",
                                              "first_nonfinite_update")},
                    layers={path: counts.as_json() for path, counts in layers.items()})

    def print_summary(self, file=None) -> None:
        if rank() == 0:
            print(summary_text(self.summary()), file=file or sys.stderr)


def _number(value):
    """``value`` with every inf or NaN in it as None: a JSON line holds no such number (a layer's input can)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _number(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_number(v) for v in value]
    return value


def _json_record(record: Dict[str, Any]) -> Dict[str, Any]:
    out = {k: v for k, v in record.items() if k != "layers"}
    out["layers"] = {path: {k: _number(v) for k, v in counts.as_json().items()}
                     for path, counts in record["layers"].items()}
    total = LayerCounts()
    for counts in record["layers"].values():
        total.add(counts.counts_only())
    totals = total.as_json()
    out["skips"] = _number(out["skips"])
    out["amax_jumps"] = _number(out["amax_jumps"])
    out["totals"] = {k: totals[k] for k in ("gradient_elements", "gradient_flushed", "underflow_fraction", "weights",
                                            "zero_gradients", "zero_gradient_fraction", "weights_expected_to_move",
                                            "updates_lost", "lost_update_fraction", "nonfinite_updates")}
    return out


def _percent(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.3g}%"


def summary_text(summary: Dict[str, Any]) -> str:
    lines = [f"preclint.watch: {summary['steps']} steps, {summary['sampled_steps']} sampled, "
             f"{summary['skipped_steps']} skipped by GradScaler; flushed gradients "
             f"{_percent(summary['underflow_fraction'])} (weights with a zero gradient "
             f"{_percent(summary['zero_gradient_fraction'])}), lost updates {_percent(summary['lost_update_fraction'])}, "
             f"non-finite weights {summary['nonfinite_updates']}"]
    first = summary["first_nonfinite"]
    if first:
        lines.append(f"  first non-finite at step {first['step']}: forward {first['first_nonfinite_forward']!r}, "
                     f"backward {first['first_nonfinite_backward']!r}, update {first['first_nonfinite_update']!r}")
    worst = sorted(((counts.get("underflow_fraction") or 0.0, counts.get("lost_update_fraction") or 0.0, path)
                    for path, counts in summary["layers"].items()), reverse=True)
    for underflow, lost, path in worst[:5]:
        if underflow >= 0.01 or lost >= 0.01:
            lines.append(f"  {path or '(model)'}: flushed gradients {_percent(underflow)}, lost updates {_percent(lost)}")
    return "\n".join(lines)

