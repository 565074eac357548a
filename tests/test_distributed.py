"""`torchrun -m preclint probe`: the ranks share the precision modes and rank 0 writes the one report,
whose ledger is the single process's (gloo on the CPU here; NCCL on GPUs runs the same code)."""
import json
import os
import subprocess
import sys

import pytest

from tests.test_probe_cli import tiny  # noqa: F401  (the model file, a fixture)


def test_two_ranks_write_the_single_process_report(tiny, tmp_path):
    argv = ["probe", tiny, "--device", "cpu", "--precision", "tf32,fp16,bf16", "--output-format", "json", "--exit-zero"]
    # both as torchrun starts them (one thread each: CPU sums over threads differ in their last bits)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    single = subprocess.run([sys.executable, "-m", "preclint", *argv], capture_output=True, text=True, timeout=300,
                            env=env, cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    single = json.loads(single.stdout)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "preclint", *argv], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    distributed = json.loads(done.stdout)  # one report: rank 1 wrote nothing
    assert distributed["environment"].pop("ranks") == 2
    assert distributed["nodes"] == single["nodes"]
    assert distributed["findings"] == single["findings"] and distributed["summary"] == single["summary"]


def test_torchrun_without_the_probe_is_one_clear_error(tiny, tmp_path):
    env = dict(os.environ, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0")
    done = subprocess.run([sys.executable, "-m", "preclint", "check", tiny], capture_output=True, text=True,
                          timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and "torchrun" in done.stderr


@pytest.fixture(autouse=True)
def _no_inherited_group(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
