"""The preclint-source pre-commit hook reads every staged file as a file, never as an option, and imports
nothing from the checkout. pre-commit runs the hook's entry, then its args, then the staged files'
names: a committed `--config=cfg.py` beside a `cfg.py` that is both Python and TOML made the hook
read the pull request's own configuration (ignore everything), and a file named `--exit-zero` (a
Python file by its shebang) made it pass. The default args end the options with `--`."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
import yaml

from tests.paths import ROOT
from tests.source.test_precommit import PRE_COMMIT, git, project, use_hook  # noqa: F401 (project: a fixture)

HOOKS = {hook["id"]: hook for hook in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text(encoding="utf-8"))}
AMP = "import torch\n\nwith torch.cuda.amp.autocast():\n    pass\n"
# Files a commit can hold whose names read as options; cfg.py is valid Python and valid TOML.
OPTION_NAMES = {"--config=cfg.py": "x = 1\n", "--exit-zero": "#!/usr/bin/env python\nx = 1\n",
                "cfg.py": '[tool.preclint]\nignore = ["PCL5"]\n'}
# `python -I -m preclint`, with this checkout's preclint first (-I leaves PYTHONPATH out)
THIS_CHECKOUT = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from preclint.cli import main; sys.exit(main())"


def _hook_command(files):
    """The command pre-commit runs for preclint-source as shipped, on ``files``."""
    hook = HOOKS["preclint-source"]
    words = shlex.split(hook["entry"])
    assert words[:4] == ["python", "-I", "-m", "preclint"]  # isolated: a checkout's libcst.py on PYTHONPATH stays out
    return [sys.executable, "-I", "-c", THIS_CHECKOUT, *words[4:], *hook.get("args", []), *files]


def _repository(directory):
    (directory / "train.py").write_text(AMP)
    for name, text in OPTION_NAMES.items():
        (directory / name).write_text(text)
    (directory / "libcst.py").write_text(f"open({str(directory / 'RAN')!r}, 'w').close()\n")
    return ["--config=cfg.py", "--exit-zero", "cfg.py", "libcst.py", "train.py"]  # as pre-commit sorts them


def test_the_source_hook_ends_its_options_before_the_file_names():
    hook = HOOKS["preclint-source"]
    assert hook["args"] == ["--"] and hook.get("pass_filenames", True) is True
    assert HOOKS["preclint"]["pass_filenames"] is False  # the graph hook is given no file names


@pytest.mark.subprocess
def test_a_file_named_as_an_option_is_checked_as_a_file(tmp_path):
    files = _repository(tmp_path)
    done = subprocess.run(_hook_command(files), cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(tmp_path), NO_COLOR="1"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "train.py:3:6: PCL502" in done.stdout
    assert not (tmp_path / "RAN").exists()  # PYTHONPATH on the checkout: its libcst.py is not preclint's


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_hook_run_by_pre_commit_reads_committed_option_names_as_files(project):  # noqa: F811
    if subprocess.run(PRE_COMMIT + ["--version"], capture_output=True).returncode != 0:
        pytest.skip("pre-commit is needed to run the hook")
    repo, env = project
    use_hook(repo, "preclint-source", "alias: source")
    _repository(repo)
    git(repo, "add", ".")
    env = dict(env, PYTHONPATH=str(repo))
    done = subprocess.run(PRE_COMMIT + ["run", "preclint-source", "--all-files"], cwd=repo, env=env,
                          capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "train.py:3:6: PCL502" in out, out
    assert not (repo / "RAN").exists(), out
