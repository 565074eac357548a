"""A fixed, seeded sample of the fuzz cases (benchmarks/fuzz): generated model files through ``preclint
check`` and mutated Python files through ``--source-only``, ``--fix`` and ``--diff``, each judged by the
fuzz oracle (no traceback, internal error, signal, hang or invalid document; a mistake is one line and
exit 2; a fix never breaks a file that compiled nor touches one it was not asked to).

The same cases run every time. ``PRECLINT_FUZZ_N=K`` runs K times as many (new seeds after the fixed
ones); ``python -m benchmarks.fuzz --models 10000 --sources 10000`` is the long run.
"""
from __future__ import annotations

import os

import pytest

from benchmarks.fuzz import cases

SCALE = max(1, int(os.environ.get("PRECLINT_FUZZ_N", "1")))
MODELS = 30 * SCALE
SOURCES = 300 * SCALE
SOURCE_BATCH = 30


def _failure(name: str, checked) -> str:
    v = checked.verdict
    run = checked.run
    tail = f"\nexit {run.rc}\nstderr: {run.stderr[-2000:]}\nstdout: {run.stdout[-1000:]}" if run else ""
    return f"{name}: {v.failure}: {v.detail}\n(rebuild it with benchmarks.fuzz.cases.build({name!r})){tail}"


@pytest.mark.parametrize("seed", range(MODELS))
def test_generated_model(seed, tmp_path):
    name = f"model-{seed}"
    case = cases.build(name)
    checked = cases.check(case, str(tmp_path))
    assert checked.verdict.ok, _failure(name, checked)


@pytest.mark.parametrize("first", range(0, SOURCES, SOURCE_BATCH))
def test_mutated_sources(first, tmp_path, monkeypatch):
    monkeypatch.setenv("PRECLINT_CACHE_DIR", str(tmp_path / "cache"))
    failures = []
    for seed in range(first, first + SOURCE_BATCH):
        name = f"source-{seed}"
        checked = cases.check(cases.build(name, "own"), str(tmp_path))
        if not checked.verdict.ok:
            failures.append(_failure(name, checked))
    assert not failures, "\n\n".join(failures)
