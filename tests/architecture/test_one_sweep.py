"""One sweep: a run followed node by node beside another is measure/sweep.py's Sweep, for the probe
(a mode beside float64) and for diff (setting B beside setting A). Each says what it measures; the
walk itself (the mode's pending operands, lining up with the first run, the first run's operands,
the replay) is written once, so that a fix to it reaches both."""
from __future__ import annotations

import pathlib

import torch

from preclint.diff import parting
from preclint.measure import sweep as walk
from preclint.measure.runners import capture_graph
from preclint.probe import ProbeOptions, measure_model
from preclint.probe import sweep as probe_sweep

ROOT = pathlib.Path(__file__).resolve().parents[2]

# what only the walk does: a subclass that wrote one of these would be walking a second time
THE_WALK = ("__call__", "_theirs", "first_operands", "replay")


def _walkers():
    found, stack = [], [walk.Sweep]
    while stack:
        cls = stack.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("preclint."):
                found.append(sub)
            stack.append(sub)
    return found


def test_the_probe_and_diff_follow_a_run_in_the_one_walk():
    modules = {cls.__module__ for cls in _walkers()}
    assert modules == {probe_sweep.__name__, parting.__name__}
    for cls in _walkers():
        assert not set(THE_WALK) & set(vars(cls)), cls


def test_the_walk_s_bookkeeping_is_written_once():
    # a second node-by-node follower would need its own producers and its own pending operands
    where = {"Producers(": set(), "pending_for(": set()}
    for path in (ROOT / "preclint").rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        for needle, found in where.items():
            if needle in text:
                found.add(str(path.relative_to(ROOT)))
    assert where["Producers("] == {"preclint/measure/sweep.py"}
    assert where["pending_for("] == {"preclint/measure/runners.py", "preclint/measure/sweep.py"}


def test_both_passes_run_through_the_walk(monkeypatch):
    seen = []
    real = walk.Sweep.__call__

    def counted(self, node, *rest):
        seen.append((type(self).__module__, node.name))
        return real(self, node, *rest)

    monkeypatch.setattr(walk.Sweep, "__call__", counted)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).eval()
    inputs = (torch.randn(4, 8),)
    graph = capture_graph(model, inputs)
    first_linear = next(n.name for n in graph.nodes if n.module_path == "0")
    result = measure_model(model, inputs, None, ("bf16",), ProbeOptions(device="cpu"))
    assert result.modes["bf16"].nodes[first_linear].local is not None
    parted = parting.part(parting.Setting("fp16", model, "fp16"), parting.Setting("bf16", model, "bf16"), inputs,
                          graph, replay_decisions=False)
    assert parted.first is not None and parted.first.contributed is not None
    assert {module for module, name in seen if name == first_linear} == {probe_sweep.__name__, parting.__name__}
