"""preclint.watch under torch.distributed: two CPU processes (gloo), DDP and FSDP2; statistics reduced
across ranks, first non-finite producers by rank, one file written (by rank 0)."""
import json

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import preclint

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))


def _worker(rank, world, store, out, kind):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        model = _model()
        if kind == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        else:
            from torch.distributed.fsdp import fully_shard  # FSDP2: only this test's second case needs it
            for layer in (model[0], model[2]):
                fully_shard(layer)
            fully_shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
        torch.manual_seed(rank)
        x, y = torch.randn(32, 8), torch.randn(32, 1)
        with preclint.watch(model, optimizer, every=2, path=out) as monitor:
            for step in range(4):
                if step == 2 and rank == 1:
                    x = x.clone()
                    x[0, 0] = float("inf")  # only rank 1 meets a non-finite value, in its first layer
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        assert len(monitor.records) == (2 if rank == 0 else 0)
    finally:
        dist.destroy_process_group()


def _run(tmp_path, kind):
    out = tmp_path / "watch.jsonl"
    mp.spawn(_worker, args=(2, str(tmp_path / "store"), str(out), kind), nprocs=2, join=True)
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def test_ddp_reduces_statistics_across_ranks(tmp_path):
    first, second = _run(tmp_path, "ddp")
    assert [first["step"], second["step"]] == [0, 2]
    assert first["world_size"] == 2
    # a replicated parameter is counted once per rank: 2 x (8*16 + 16 + 16 + 1) weights with a gradient
    assert first["totals"]["weights_expected_to_move"] == 2 * (8 * 16 + 16 + 16 + 1)
    assert first["first_nonfinite_forward"] is None
    assert second["first_nonfinite_forward"] == "module.0"
    assert second["first_nonfinite_forward_by_rank"] == [{"rank": 1, "name": "module.0"}]
    assert second["totals"]["nonfinite_updates"] > 0  # DDP averaged rank 1's NaN gradient into both ranks


def _has_fsdp2() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401 - only asking whether this build has it
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _has_fsdp2(), reason="this torch build has no FSDP2 (torch.distributed.fsdp.fully_shard)")
def test_fsdp2_counts_each_shard_once(tmp_path):
    first, second = _run(tmp_path, "fsdp")
    assert first["world_size"] == 2
    assert first["totals"]["weights_expected_to_move"] == 8 * 16 + 16 + 16 + 1  # shards add up to the model
    assert second["first_nonfinite_forward_by_rank"][0]["rank"] == 1
