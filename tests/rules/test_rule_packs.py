"""A rule pack installed as a distribution (an entry point in the group ``preclint.rules``) is found with
no other edit: its rules run in ``preclint check``, ``preclint rule`` shows them, and select, ignore
and noqa take their codes. A pack that cannot be loaded, or that clashes, is one line and exit 2.

The distributions here are real ones: a package and its ``.dist-info`` (METADATA, entry_points.txt)
in a folder on sys.path, as pip leaves them, which importlib.metadata reads."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import preclint.rules
from preclint.cli import main
from preclint.source import suppress
from tests.paths import ROOT

ACME = '''
from preclint.core.ir import Kind
from preclint.rules.base import Rule


class LinearSeen(Rule):
    code = "ACME001"
    name = "acme-linear-seen"
    summary = "A linear layer, which this project keeps in float32."
    why = "The project's policy keeps every linear layer in float32."
    example = "self.fc = nn.Linear(8, 8)"
    fix = "Wrap the layer in `torch.autocast(device_type, enabled=False)`."
    needs = ()

    def check_graph(self, ctx):
        for node in ctx.graph.nodes:
            if node.kind == Kind.LINEAR:
                yield self.finding(node, f"{ctx.display(node.name)} is a linear layer.")
'''

MODEL = '''
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(8, 8)
        self.second = nn.Linear(8, 4)

    def forward(self, x):
        x = self.first(x)
        return self.second(x){noqa}


example_inputs = (torch.randn(2, 8),)
'''


def install(site, dist: str, entry_points: str, modules: dict) -> None:
    """A distribution ``dist`` 1.0 in ``site``: its modules, and a dist-info with its entry points."""
    for name, text in modules.items():
        path = site.joinpath(*name.split("/"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    info = site / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[preclint.rules]\n{entry_points}\n")
    forget()  # as a new process would: the packs are looked up afresh


def forget() -> None:
    preclint.rules.rediscover()
    suppress._known.cache_clear()


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A folder on sys.path for distributions; the packs found are forgotten before and after."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    forget()
    yield folder
    for name in [m for m in sys.modules if m.split(".")[0] in ("acme_rules", "other_rules", "broken_rules")]:
        del sys.modules[name]
    forget()


@pytest.fixture
def acme(site):
    install(site, "acme-rules", "acme = acme_rules", {"acme_rules/__init__.py": ACME})
    return site


def check_json(tmp_path, monkeypatch, capsys, *flags, noqa: str = ""):
    (tmp_path / "model.py").write_text(MODEL.format(noqa=noqa))
    monkeypatch.chdir(tmp_path)
    code = main(["check", "model.py", "--isolated", "--output-format", "json", "--exit-zero", *flags])
    out = capsys.readouterr().out
    assert code == 0, out
    return [f["code"] for f in json.loads(out)["findings"]]


def test_an_installed_packs_rule_runs_in_check_and_its_finding_is_in_the_json(acme, tmp_path):
    (tmp_path / "model.py").write_text(MODEL.format(noqa=""))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(acme)])}
    proc = subprocess.run([sys.executable, "-m", "preclint", "check", "model.py", "--isolated", "--output-format", "json"],
                          capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    findings = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "ACME001"]
    assert [(f["name"], f["module"], f["location"]["line"]) for f in findings] == [
        ("acme-linear-seen", "first", 13), ("acme-linear-seen", "second", 14)]
    assert all(f["message"].endswith(" is a linear layer.") and f["severity"] == "warning" for f in findings)
    assert proc.returncode == 1  # its warnings fail the check as the built-in rules' do


def test_preclint_rule_shows_a_packs_rule(acme, capsys):
    assert main(["rule", "ACME001"]) == 0
    page = capsys.readouterr().out
    assert page.startswith("ACME001 acme-linear-seen\n") and "keeps every linear layer in float32" in page
    assert main(["rule", "acme-linear-seen"]) == 0 and capsys.readouterr().out == page
    assert main(["rule", "--all"]) == 0 and "ACME001 acme-linear-seen" in capsys.readouterr().out


def test_select_ignore_and_noqa_take_a_packs_codes(acme, tmp_path, monkeypatch, capsys):
    everything = check_json(tmp_path, monkeypatch, capsys)
    assert everything.count("ACME001") == 2
    assert set(check_json(tmp_path, monkeypatch, capsys, "--select", "ACME")) == {"ACME001"}
    assert check_json(tmp_path, monkeypatch, capsys, "--select", "ACME001").count("ACME001") == 2
    assert "ACME001" not in check_json(tmp_path, monkeypatch, capsys, "--ignore", "ACME001")
    assert check_json(tmp_path, monkeypatch, capsys, noqa="  # noqa: ACME001").count("ACME001") == 1
    assert check_json(tmp_path, monkeypatch, capsys, noqa="  # preclint: ignore[acme-linear-seen]").count("ACME001") == 1


def test_without_the_pack_its_code_is_unknown(site, tmp_path, monkeypatch, capsys):
    (tmp_path / "model.py").write_text(MODEL.format(noqa=""))
    monkeypatch.chdir(tmp_path)
    assert main(["check", "model.py", "--isolated", "--select", "ACME001"]) == 2
    assert "unknown rule code or prefix 'ACME001'" in capsys.readouterr().err


def one_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_pack_that_cannot_be_imported_is_one_line_naming_its_distribution(site, capsys):
    install(site, "broken-rules", "broken = broken_rules", {"broken_rules/__init__.py": "import not_installed_anywhere\n"})
    line = one_error(capsys, ["rule", "--all"])
    assert line == ("preclint: error: rule pack broken-rules (entry point broken = broken_rules) cannot be loaded: "
                    "ModuleNotFoundError: No module named 'not_installed_anywhere'")


@pytest.mark.parametrize("pack, says", [
    ("from acme_rules import LinearSeen\n\nclass Again(LinearSeen):\n    name = 'acme-again'\n",
     "Again is 'ACME001', which acme-rules (entry point acme = acme_rules) already uses"),
    ("from acme_rules import LinearSeen\n\nclass Again(LinearSeen):\n    code = 'ACME002'\n    name = 'fp16-overflow'\n",
     "Again is 'fp16-overflow', which preclint already uses"),
    ("from acme_rules import LinearSeen\n\nclass Again(LinearSeen):\n    code = 'PCL999'\n    name = 'acme-again'\n",
     "Again's code 'PCL999' is not letters then digits with a prefix other than PCL"),
])
def test_a_pack_that_clashes_is_one_line_naming_its_distribution(acme, capsys, pack, says):
    install(acme, "other-rules", "other = other_rules", {"other_rules/__init__.py": pack})
    line = one_error(capsys, ["rule", "--all"])
    assert line.startswith("preclint: error: rule pack other-rules (entry point other = other_rules)") and says in line


def test_an_entry_point_may_name_a_list_of_rules(site, capsys):
    install(site, "acme-rules", "acme = acme_rules:RULES",
            {"acme_rules/__init__.py": ACME + "\n\nRULES = [LinearSeen]\n"})
    assert main(["rule", "ACME001"]) == 0 and capsys.readouterr().out.startswith("ACME001 acme-linear-seen\n")
    install(site, "listed-rules", "listed = acme_rules:LinearSeen.name", {})
    assert "names str 'acme-linear-seen', not a module or a list of rules" in one_error(capsys, ["rule", "--all"])
