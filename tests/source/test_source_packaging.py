"""The preclint-source hook's environment: what .pre-commit-hooks.yaml has pip install is the source
side's own dependencies, complete, and nothing of the graph side (torch, torchvision, plotly)."""
from __future__ import annotations

import pytest

import subprocess
import sys
from importlib.metadata import requires

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from tests.paths import ROOT

GRAPH_SIDE = {"torch", "torchvision", "plotly", "numpy", "transformers", "timm"}


def hook_requirements():
    hooks = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    args = hooks["preclint-source"]["additional_dependencies"]
    assert args[0] == "--no-deps"  # else pip would install preclint's own dependencies, torch among them
    return [Requirement(text) for text in args[1:]]


def test_the_hook_installs_no_torch_and_everything_its_packages_need():
    reqs = hook_requirements()
    names = {canonicalize_name(r.name) for r in reqs}
    assert not names & GRAPH_SIDE
    assert {"libcst", "rich"} <= names
    for req in reqs:  # closed: every package's own dependencies (on this Python) are in the list
        if req.marker is not None and not req.marker.evaluate():
            continue
        for text in requires(req.name) or []:
            need = Requirement(text)
            if need.marker is None or need.marker.evaluate({"extra": ""}):
                assert canonicalize_name(need.name) in names, f"{req.name} needs {need.name}"


BLOCK = """
import importlib.abc, importlib.metadata as md, sys
# every module an installed distribution provides, except preclint and the hook's packages
refused = {top for top, dists in md.packages_distributions().items()
           if top != "preclint" and not any(d.lower().replace("_", "-") in NAMES for d in dists)}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in refused:
            raise ImportError(f"the source side imported {name}, which its hook environment does not install")
sys.meta_path.insert(0, Block())
from preclint.cli import main
sys.exit(main(["check", "--source-only", "--no-cache", "--output-format", "concise", sys.argv[1]]))
"""


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_source_side_runs_on_the_hooks_packages_alone(tmp_path):
    """`preclint check --source-only` with every installed package other than preclint and the hook's
    refused: what the hook's environment holds is enough, and torch is never imported."""
    names = {canonicalize_name(r.name) for r in hook_requirements()}
    path = tmp_path / "train.py"
    path.write_text("import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n")
    done = subprocess.run([sys.executable, "-c", f"NAMES = {sorted(names)!r}\n" + BLOCK, str(path)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1 and "PCL502" in done.stdout, done.stdout + done.stderr
