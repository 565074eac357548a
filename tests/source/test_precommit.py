"""The hooks of .pre-commit-hooks.yaml, run by the real pre-commit in a throwaway git repository.

preclint-source is installed by pre-commit into an isolated environment from this checkout, as the
hook is shipped (pip's --no-deps and the source side's own dependencies), and must find the staged
problem with no torch in that environment. The graph hook runs in this environment (language:
system) on the model its args name. About 15 s, mostly pip.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.paths import ROOT

PRE_COMMIT = [sys.executable, "-m", "pre_commit"]

pytestmark = pytest.mark.skipif(
    subprocess.run(PRE_COMMIT + ["--version"], capture_output=True).returncode != 0 or shutil.which("git") is None,
    reason="pre-commit (pip install pre-commit) and git are needed to run the hooks",
)

NET = """\
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)
"""


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def project(tmp_path):
    """A user's repository, and an environment where pre-commit keeps its hook environments apart."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "dev@example.com")
    git(repo, "config", "user.name", "dev")
    (repo / "train.py").write_text("import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n")
    (repo / "clean.py").write_text("x = 1\n")
    (repo / "net.py").write_text(NET)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "init")
    env = dict(os.environ, PRE_COMMIT_HOME=str(tmp_path / "cache"), PRE_COMMIT_COLOR="never")
    # language: system hooks find preclint on PATH: the one installed next to this interpreter
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    return repo, env


def use_hook(repo, hook: str, option: str) -> None:
    """A .pre-commit-config.yaml in ``repo`` with this checkout's ``hook`` and one option line."""
    rev = git(ROOT, "rev-parse", "HEAD")
    (repo / ".pre-commit-config.yaml").write_text(
        f"repos:\n- repo: {ROOT}\n  rev: {rev}\n  hooks:\n  - id: {hook}\n    {option}\n")


@pytest.mark.slow
@pytest.mark.subprocess
def test_source_hook_runs_without_torch_and_reports(project):
    repo, env = project
    use_hook(repo, "preclint-source", "alias: source")  # the hook as shipped: its own dependencies
    # a file the project excludes: pre-commit names it, the hook's --force-exclude leaves it out
    (repo / "pyproject.toml").write_text('[tool.preclint]\nexclude = ["vendored/"]\n')
    (repo / "vendored").mkdir()
    (repo / "vendored" / "old.py").write_text("import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n")
    git(repo, "add", ".")
    done = subprocess.run(
        PRE_COMMIT + ["run", "preclint-source", "--all-files"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert 'train.py:3:6: PCL502 [*] `torch.cuda.amp.autocast` is deprecated' in out
    assert "clean.py" not in out.split("preclint (source)")[-1]
    assert "vendored" not in out and "1 named file excluded by the configuration" in out
    pythons = list(Path(env["PRE_COMMIT_HOME"]).glob("repo*/py_env-*/bin/python"))
    assert pythons, "pre-commit built no environment"
    probe = ("import importlib.util as u; print(u.find_spec('libcst') is not None, "
             "*(u.find_spec(name) is None for name in ('torch', 'torchvision', 'plotly')))")
    assert subprocess.run([str(pythons[0]), "-c", probe], capture_output=True, text=True).stdout.split() == ["True"] * 4


@pytest.mark.slow
@pytest.mark.subprocess
def test_graph_hook_runs_in_the_users_environment(project):
    repo, env = project
    use_hook(repo, "preclint", "args: [net.py, --model, Net, --input-shape, '2,8']")
    done = subprocess.run(
        PRE_COMMIT + ["run", "--hook-stage", "manual", "preclint", "--all-files"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "preclint (graph, in your environment)" in out and "Passed" in out
