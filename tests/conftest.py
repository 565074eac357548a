"""Shared options and fixtures of the test suite (see CONTRIBUTING.md, "Tests"): the snapshot flag, a
small model file for the probe's command line, an empty project for the source-only one, and a
state dict that differs from the one a model builds."""
from __future__ import annotations

import textwrap

import pytest

from tests.paths import MODELS


def pytest_addoption(parser):
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite tests/snapshots/ with what the rule examples report now")


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
