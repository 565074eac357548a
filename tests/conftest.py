"""Shared options and markers of the test suite (see CONTRIBUTING.md, "Tests")."""
from __future__ import annotations

import pytest


def pytest_addoption(parser):
    parser.addoption("--update-snapshots", action="store_true", default=False,
                     help="rewrite tests/snapshots/ with what the rule examples report now")


@pytest.fixture
def update_snapshots(request) -> bool:
    return request.config.getoption("--update-snapshots")
