"""A monitor's record of one step reduced across the ranks of a torch.distributed run (DDP, FSDP2): counts
summed, largest magnitudes the maximum, block scales merged, first non-finite producers and GradScaler
skips listed by rank. Every rank calls it on the same steps; every rank gets the reduced record (rank 0
writes it)."""
from __future__ import annotations

from typing import Any, Dict, List

import torch.distributed as dist

from preclint.training.watch_record import LayerCounts

PRODUCERS = ("first_nonfinite_forward", "first_nonfinite_backward", "first_nonfinite_update")


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_record(record: Dict[str, Any]) -> Dict[str, Any]:
    """``record`` of this rank, reduced over all ranks where the run is distributed (as it is otherwise)."""
    if not is_distributed():
        record["world_size"] = 1
        return record
    gathered: List[Dict[str, Any]] = [None] * dist.get_world_size()  # type: ignore[list-item]
    dist.all_gather_object(gathered, record)
    return merge_records(gathered)


def merge_records(records: List[Dict[str, Any]]) -> Dict[str, Any]:
    """One record from each rank's (in rank order), reduced."""
    merged = dict(records[0])
    merged["world_size"] = len(records)
    layers: Dict[str, LayerCounts] = {}
    for record in records:
        for path, counts in record["layers"].items():
            layers.setdefault(path, LayerCounts()).add(counts)
    merged["layers"] = layers
    for key in PRODUCERS:
        found = [dict(rank=r, name=record[key]) for r, record in enumerate(records) if record[key]]
        merged[key] = found[0]["name"] if found else None
        merged[f"{key}_by_rank"] = found
    merged["skipped"] = any(record["skipped"] for record in records)
    merged["skips"] = [dict(skip, rank=r) for r, record in enumerate(records) for skip in record["skips"]]
    merged["amax_jumps"] = [dict(jump, rank=r) for r, record in enumerate(records) for jump in record.get("amax_jumps", [])]
    merged["amax_jump_count"] = sum(record.get("amax_jump_count", 0) for record in records)
    merged["nonfinite_gradients"] = sorted({n for record in records for n in record["nonfinite_gradients"]})[:8]
    return merged
