"""`torchrun -m preclint probe`: rank 0 checks while the other ranks measure the precision modes, and
rank 0 writes the one report, whose ledger is the single process's (gloo on the CPU here; NCCL on GPUs
runs the same code)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest


# FX cannot trace it (a branch on a value), so every rank records it eagerly; its max over a dim and
# its argmax count flips, and its linear layers are judged for TF32 from the check's statistics
EAGER = """
    import torch
    from torch import nn


    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(24, 48)
            self.out = nn.Linear(48, 12)

        def forward(self, x):
            h = torch.tanh(self.inp(x))
            if float(h.abs().mean()) > 0.1:
                h = h * 2
            logits = self.out(h)
            best, _ = logits.max(dim=-1)
            return logits.softmax(-1), logits.argmax(-1), best


    def example_inputs():
        torch.manual_seed(0)
        return (torch.randn(16, 24),)
"""

# records another graph on rank 1 than the check does on rank 0
BY_RANK = """
    import os

    import torch
    from torch import nn


    class ByRank(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 16)
            self.out = nn.Linear(16, 4)

        def forward(self, x):
            h = self.inp(x)
            if os.environ.get("RANK") == "1":
                h = torch.relu(h)
            return self.out(h)


    def example_inputs():
        torch.manual_seed(0)
        return (torch.randn(4, 8),)
"""


def _outside_torchrun() -> dict:
    """This environment without a process group's variables, one thread a process as torchrun starts
    them (CPU sums over threads differ in their last bits)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    env["OMP_NUM_THREADS"] = "1"
    return env


def _single_and_distributed(model: str, tmp_path, ranks: int = 2, precisions: str = "tf32,fp16,bf16"):
    argv = ["probe", model, "--device", "cpu", "--precision", precisions, "--output-format", "json", "--exit-zero"]
    env = _outside_torchrun()
    single = subprocess.run([sys.executable, "-m", "preclint", *argv], capture_output=True, text=True, timeout=300,
                            env=env, cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-2000:]
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks),
                           "-m", "preclint", *argv], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[:3000] + "\n...\n" + done.stderr[-1000:]
    distributed = json.loads(done.stdout)  # one report: the other ranks wrote nothing
    assert distributed["environment"].pop("ranks") == ranks
    return json.loads(single.stdout), distributed


@pytest.mark.slow
@pytest.mark.subprocess
def test_two_ranks_write_the_single_process_report(tiny, tmp_path):
    single, distributed = _single_and_distributed(tiny, tmp_path)
    assert distributed["nodes"] == single["nodes"]
    assert distributed["findings"] == single["findings"] and distributed["summary"] == single["summary"]


@pytest.mark.slow
@pytest.mark.subprocess
def test_an_eagerly_recorded_model_with_decisions_has_the_single_process_ledger(tmp_path):
    model = tmp_path / "gate.py"
    model.write_text(textwrap.dedent(EAGER))
    single, distributed = _single_and_distributed(str(model), tmp_path, ranks=3)  # ranks 1 and 2 share the modes
    assert distributed["capture"] == "function-mode"
    assert distributed["nodes"] == single["nodes"]
    assert distributed["findings"] == single["findings"] and distributed["summary"] == single["summary"]
    assert distributed["notes"] == single["notes"]
    flips = {row["node"] for row in single["nodes"] for m in row["modes"].values() if "flips" in m}
    assert {"argmax", "max"} <= flips
    assert any("tf32_applied" in m for row in single["nodes"] for m in row["modes"].values())


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_rank_that_records_another_graph_leaves_its_modes_to_rank_0(tmp_path):
    model = tmp_path / "by_rank.py"
    model.write_text(textwrap.dedent(BY_RANK))
    single, distributed = _single_and_distributed(str(model), tmp_path, precisions="tf32,fp16")
    assert distributed["nodes"] == single["nodes"] and distributed["summary"] == single["summary"]
    added = [n for n in distributed["notes"] if n not in single["notes"]]
    assert added == ["probe: rank 1 recorded another graph than the check's for tf32, fp16: measured by rank 0"], added


@pytest.mark.slow
@pytest.mark.subprocess
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


FAILS_ON = """
    import os

    import torch
    from torch import nn


    class FailsOn(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 4)

        def forward(self, x):
            if os.environ.get("RANK") == "{rank}":
                raise RuntimeError("no memory on this rank")
            return self.inp(x)


    def example_inputs():
        return (torch.randn(4, 8),)
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_rank_that_fails_leaves_its_modes_to_rank_0(tmp_path):
    model = tmp_path / "fails_on_1.py"
    model.write_text(textwrap.dedent(FAILS_ON.replace("{rank}", "1")))
    single, distributed = _single_and_distributed(str(model), tmp_path, precisions="tf32")
    assert distributed["nodes"] == single["nodes"] and distributed["summary"] == single["summary"]
    added = [n for n in distributed["notes"] if n not in single["notes"]]
    assert len(added) == 1 and added[0].startswith("probe: rank 1 could not measure tf32 (")
    assert "no memory on this rank" in added[0] and added[0].endswith("): measured by rank 0")


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_model_rank_0_cannot_check_ends_every_rank_at_once(tmp_path):
    model = tmp_path / "fails_on_0.py"
    model.write_text(textwrap.dedent(FAILS_ON.replace("{rank}", "0")))
    env = _outside_torchrun()
    # (before rank 0 took part in the gathering of a model it could not check, rank 1 waited --timeout)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "preclint", "probe", str(model), "--device", "cpu", "--precision", "tf32",
                           "--timeout", "60"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode != 0 and done.stdout == ""
    assert "no memory on this rank" in done.stderr


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_report_is_the_same_figure_for_figure_in_every_process(tmp_path):
    """What rank 0 reports must not depend on which process computed it: the gains were summed in
    the order of a set of node names, which Python's hash seed changes from process to process."""
    model = tmp_path / "gate.py"
    model.write_text(textwrap.dedent(EAGER))
    reports = []
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed, OMP_NUM_THREADS="1")
        done = subprocess.run([sys.executable, "-m", "preclint", "check", str(model), "--output-format", "json",
                               "--exit-zero"], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        reports.append(done.stdout)
    assert reports[0] == reports[1]
