"""The probe on several GPUs (or hosts) under torch.distributed, started by torchrun:

    torchrun --nproc-per-node 2 -m preclint probe model.py --device cuda

Every rank loads the model, runs the check and the probe's float64 reference on its own GPU, and
measures its share of the precision modes (rank r takes modes r, r + N, ...); the measurements are
then gathered to every rank, so each builds the same report, and rank 0 alone writes it. A mode is
measured by one rank exactly as a single process measures it, so the ledger is the single-GPU one.

The ranks exchange only the measurements (a few kilobytes per node), never activations or weights:
several hosts work the same way (torchrun --nnodes M --node-rank i --rdzv-endpoint HOST:PORT), over
NCCL on GPUs and gloo on CPUs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Sequence, Tuple


@dataclass(frozen=True)
class Ranks:
    rank: int
    world: int
    local_rank: int

    @property
    def leader(self) -> bool:
        return self.rank == 0


def launched() -> bool:
    """Whether torchrun (or another launcher setting WORLD_SIZE) started this process among others."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        return False


def join(device_choice: str, timeout_s: float = 1800.0) -> Ranks:
    """Join the process group torchrun set up (NCCL where the probe runs on GPUs, gloo otherwise)
    and make this rank's GPU the current one. A rank that fails before the measurements are gathered
    leaves the others waiting ``timeout_s`` at most."""
    import datetime

    import torch
    import torch.distributed as dist

    from preclint.errors import UserError

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    gpu = device_choice != "cpu" and torch.cuda.is_available()
    if gpu:
        if local_rank >= torch.cuda.device_count():
            raise UserError(f"rank {rank} has local rank {local_rank}, but this host has "
                            f"{torch.cuda.device_count()} GPU(s): start at most that many processes per host")
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if gpu else "gloo", timeout=datetime.timedelta(seconds=timeout_s or 1800.0))
    return Ranks(rank, world, local_rank)


def share(modes: Sequence[str], ranks: Ranks) -> Tuple[str, ...]:
    """The modes this rank measures."""
    return tuple(modes[ranks.rank::ranks.world])


def gather(result, modes: Sequence[str], ranks: Ranks):
    """``result`` with every rank's modes, in the order of ``modes``; timings are each stage's
    longest, notes each rank's (once)."""
    import torch.distributed as dist

    parts = [None] * ranks.world
    dist.all_gather_object(parts, result)
    measured = {mode: measure for part in parts for mode, measure in part.modes.items()}
    result.modes = {mode: measured[mode] for mode in modes if mode in measured}
    timings = {}
    for part in parts:
        for stage, seconds in part.timings.items():
            timings[stage] = max(timings.get(stage, 0.0), seconds)
    result.timings = timings
    notes = []
    for part in parts:
        notes.extend(n for n in part.notes if n not in notes)
    result.notes = notes
    result.environment["modes"] = {mode: m.how for mode, m in result.modes.items()}
    result.environment["ranks"] = ranks.world
    return result


def leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
