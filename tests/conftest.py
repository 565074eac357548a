"""Shared options and fixtures of the test suite (see CONTRIBUTING.md, "Tests"): the snapshot flag, a
small model file for the probe's command line, an empty project for the source-only one, and a
state dict that differs from the one a model builds."""
from __future__ import annotations

import os
import textwrap

import pytest

from tests.paths import MODELS


def pytest_addoption(parser):
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite tests/snapshots/ with what the rule examples report now")
    parser.addoption("--cpu-durations", type=int, default=0, metavar="N",
                     help="list the N tests that cost the most CPU (with their subprocesses): what decides "
                          "the slow marker, since wall time on a shared machine measures the neighbours")


_CPU_COSTS = pytest.StashKey[list]()


def _cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    start = _cpu_seconds()
    yield
    item.config.stash.setdefault(_CPU_COSTS, []).append((_cpu_seconds() - start, item.nodeid))


def pytest_terminal_summary(terminalreporter, config):
    count = config.getoption("--cpu-durations")
    costs = sorted(config.stash.get(_CPU_COSTS, []), reverse=True)
    if not count or not costs:
        return
    terminalreporter.section(f"the {count} tests that cost the most CPU")
    for seconds, nodeid in costs[:count]:
        terminalreporter.write_line(f"{seconds:7.2f}s  {nodeid}")
    terminalreporter.write_line(f"{sum(s for s, _ in costs):7.2f}s  all {len(costs)} tests")


@pytest.fixture
def update_snapshots(request) -> bool:
    return request.config.getoption("--update-snapshots")


TINY = """
    import torch
    from torch import nn


    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.dw = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.head = nn.Linear(16, 10)

        def forward(self, x):
            x = torch.relu(self.stem(x))
            x = x + self.dw(x)
            return self.head(x.mean(dim=(2, 3)))


    def example_inputs():
        torch.manual_seed(0)
        return (torch.rand(2, 3, 12, 12),)
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "tiny.py"
    path.write_text(textwrap.dedent(TINY))
    return str(path)


@pytest.fixture
def project(tmp_path, monkeypatch):
    """An empty project as the working directory, with its own cache and no user configuration."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "pkg").mkdir()
    return tmp_path


@pytest.fixture
def trained_state_dict():
    """A state dict for blocks_and_net.Net that differs from what seed 0 builds."""
    from preclint.load.loader import load_model

    return load_model(str(MODELS / "blocks_and_net.py"), seed=123).module.state_dict()
