"""Benchmark: what ``preclint.watch.LightningCallback`` costs a Lightning ``Trainer.fit`` at its default interval.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/watch_overhead_lightning.py --out benchmarks/results/watch_overhead_lightning_cpu.json

The three loops of benchmarks/watch_overhead.py (an MLP, a CNN with batch norm, a transformer encoder; AdamW,
float32 on the CPU), each as a LightningModule fitted by ``lightning.Trainer(max_steps=--steps,
accelerator=--device, logger=False, enable_checkpointing=False)`` on one repeated batch, plainly and with the
callback at ``every`` = the default, alternating on one module. The clock (process CPU time on the CPU) runs
from the first batch's start to the end of training, so the Trainer's setup is left out of both. Per loop:
``ratio`` (the median over rounds of the watched fit's time over the plain one's), one sampled step's cost in
plain steps (``sampled_step_cost``: fits at every=1 against plain fits), what the callback's and the
monitor's hooks cost a step between samples (``hooks_between_samples_us``) and the overhead the two predict
at the default interval (``predicted_overhead``), the figure ``within_limit`` judges, as in watch_overhead.py.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import warnings
from typing import Any, Dict

import torch

if __package__ in (None, ""):
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import lightning  # noqa: E402

import preclint  # noqa: E402
from benchmarks.provenance import stamp  # noqa: E402
from benchmarks.watch_overhead import LIMIT, loops  # noqa: E402
from preclint.training.watch import DEFAULT_EVERY  # noqa: E402


class Module(lightning.LightningModule):
    def __init__(self, model: torch.nn.Module, loss_fn) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def training_step(self, batch, batch_idx):
        x, y = batch
        return self.loss_fn(self.model(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Clock(lightning.Callback):
    """The process's CPU time (wall time after a synchronize on a GPU) from the first batch to the end."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.start, self.seconds = device, None, None
        self.read = time.perf_counter if device.type == "cuda" else time.process_time

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.start is None:
            if self.device.type == "cuda":
                torch.cuda.synchronize()
            self.start = self.read()

    def on_train_end(self, trainer, pl_module) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.seconds = self.read() - self.start


def fit(module: Module, batch, steps: int, every: int, device: torch.device) -> float:
    """Seconds of ``steps`` training steps (every=0: no callback)."""
    clock = Clock(device)
    callbacks = [clock] + ([preclint.watch.LightningCallback(every=every, summary=False)] if every else [])
    trainer = lightning.Trainer(max_steps=steps, accelerator=device.type, devices=1, logger=False,
                                enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                                callbacks=callbacks)
    trainer.fit(module, torch.utils.data.DataLoader([batch] * steps, batch_size=None))
    return clock.seconds


def hook_seconds(module: Module, calls: int = 20000) -> float:
    """What a step between samples costs in hooks: the callback's two Lightning hooks and the monitor's
    post-step and model-call hooks, called as Lightning and torch call them."""
    callback = preclint.watch.LightningCallback(every=10 ** 9, summary=False)
    optimizer = module.configure_optimizers()
    trainer = type("Trainer", (), {"optimizers": [optimizer], "precision_plugin": None})()
    callback.on_train_start(trainer, module)
    watch = callback.watch
    watch.step = 1
    start = time.process_time()
    for _ in range(calls):
        callback.on_train_batch_start(trainer, module, None, 0)
        watch._on_forward(module, ())
        callback.on_before_optimizer_step(trainer, module, optimizer)
        watch._post_step(optimizer, (), {})
    elapsed = time.process_time() - start
    watch.close()
    return elapsed / calls


def measure(name: str, build, device: torch.device, steps: int, rounds: int, every: int) -> Dict[str, Any]:
    torch.manual_seed(0)
    model, x, y, loss_fn = build()
    module, batch = Module(model, loss_fn), (x.to(device), y.to(device))
    fit(module, batch, 3, 0, device)  # warm-up: allocator, kernels, Adam's state
    plain, watched = [], []
    for _ in range(rounds):
        plain.append(fit(module, batch, steps, 0, device))
        watched.append(fit(module, batch, steps, every, device))
    ratios = [b / a for a, b in zip(plain, watched)]
    short = max(2, steps // 10)
    short_plain = [fit(module, batch, short, 0, device) for _ in range(3)]
    short_sampled = [fit(module, batch, short, 1, device) for _ in range(3)]
    cost = statistics.median(short_sampled) / statistics.median(short_plain)
    step_s = statistics.median(plain) / steps
    hooks_us = 1e6 * hook_seconds(module)
    predicted = (cost - 1) / every + hooks_us * 1e-6 / step_s
    ratio = statistics.median(ratios)
    result = dict(step_ms=round(1000 * step_s, 3), watched_step_ms=round(1000 * statistics.median(watched) / steps, 3),
                  ratio=round(ratio, 4), overhead=round(ratio - 1, 4), ratios=[round(r, 4) for r in ratios],
                  ratio_quartiles=[round(q, 4) for q in statistics.quantiles(ratios, n=4)] if len(ratios) > 1 else None,
                  ratio_of_fastest=round(min(watched) / min(plain), 4),
                  sampled_step_cost=round(cost, 3), hooks_between_samples_us=round(hooks_us, 2),
                  predicted_overhead=round(predicted, 4))
    print(f"{name}: {result['step_ms']:.2f} ms a step in Trainer.fit, watched x{ratio:.3f} (rounds {result['ratios']}); "
          f"a sampled step costs {cost:.2f} steps, hooks {hooks_us:.1f} us -> {100 * predicted:.2f}% at every={every}",
          flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=DEFAULT_EVERY, help="steps a fit (default: one interval)")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--every", type=int, default=DEFAULT_EVERY)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    device = torch.device(args.device)
    results = {name: measure(name, build, device, args.steps, args.rounds, args.every)
               for name, build in loops(args.batch).items()}
    worst_predicted = max(r["predicted_overhead"] for r in results.values())
    summary = dict(every=args.every, steps_a_fit=args.steps, rounds=args.rounds, device=str(device),
                   threads=torch.get_num_threads(), lightning=lightning.__version__, limit=LIMIT,
                   worst_overhead=max(r["overhead"] for r in results.values()),
                   worst_predicted_overhead=worst_predicted, within_limit=bool(worst_predicted <= LIMIT))
    print(json.dumps(summary))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(stamp(dict(summary=summary, loops=results)), f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
