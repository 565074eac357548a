"""The scripts that keep the rule pack's surroundings in step with it: the README's rule table is the
one the rule classes generate, and a scaffolded rule is found by the pack and passes its own
generated example tests."""
from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

import preclint.rules
from preclint.rules.base import markdown_table
from preclint.rules import all_rules
from tests.test_rule_examples import assert_example

SCRIPTS = pathlib.Path(__file__).resolve().parent.parent / "scripts"


def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"preclint_scripts_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_rule_table_is_generated_from_the_rules():
    rule_table = _script("rule_table")
    text = rule_table.README.read_text(encoding="utf-8")
    assert rule_table.generated_readme(text) == text, "run python scripts/rule_table.py"
    for code, rule in all_rules().items():
        assert f"| {code} | {rule.name} |" in text


def test_every_rule_has_its_generated_page():
    rule_table = _script("rule_table")
    assert rule_table.stale_pages() == [], "run python scripts/rule_table.py"
    for code, rule in all_rules().items():
        page = (rule_table.RULE_PAGES / f"{code}.md").read_text(encoding="utf-8")
        assert page.startswith(f"# {code} {rule.name}\n") and "## Why it matters" in page and "## Fix" in page


def test_a_changed_rule_makes_its_page_stale(monkeypatch):
    rule_table = _script("rule_table")
    rule = all_rules()["PCL101"]
    monkeypatch.setattr(rule, "fix", rule.fix + " And one more thing.")
    assert rule_table.stale_pages() == ["PCL101.md"]


@pytest.fixture
def scratch_pack(tmp_path, monkeypatch):
    """A directory the rule pack also walks (``model/`` and ``source/`` in it), for rules scaffolded
    during a test."""
    for kind in preclint.rules.KINDS:
        package = importlib.import_module(f"preclint.rules.{kind}")
        (tmp_path / kind).mkdir()
        monkeypatch.setattr(package, "__path__", list(package.__path__) + [str(tmp_path / kind)])
    preclint.rules.rediscover()
    before = set(sys.modules)
    yield tmp_path
    for name in set(sys.modules) - before:
        if name.startswith("preclint.rules."):
            del sys.modules[name]
    monkeypatch.undo()
    preclint.rules.rediscover()


def test_a_scaffolded_graph_rule_is_discovered_and_its_examples_pass(scratch_pack):
    new_rule = _script("new_rule")
    path = new_rule.scaffold("PCL298", "scaffolded-check", "A scaffolded rule.", directory=scratch_pack / "model")
    assert path.name == "scaffolded_check.py"
    rule = all_rules()["PCL298"]
    assert rule.why.strip() and rule.example.strip() and rule.fix.strip()
    assert rule.bad and rule.good
    for kind, examples in (("bad", rule.bad), ("good", rule.good)):
        for example in examples:
            assert_example(rule, kind, example)
    assert "| PCL298 | scaffolded-check | model |" in markdown_table(list(all_rules().values()))


def test_a_scaffolded_source_rule_is_discovered_and_its_snippets_pass(scratch_pack):
    from preclint.source.run import check_text

    new_rule = _script("new_rule")
    new_rule.scaffold("PCL598", "scaffolded-source", "A scaffolded source rule.", directory=scratch_pack / "source",
                      source=True, api="torch.testing.assert_allclose")
    rule = all_rules()["PCL598"]
    for snippet in rule.invalid:
        assert "PCL598" in [f.code for f in check_text(snippet, "pkg/module.py")]
    for snippet in rule.valid:
        assert "PCL598" not in [f.code for f in check_text(snippet, "pkg/module.py")]


def test_the_scaffold_refuses_a_taken_code_or_name(tmp_path):
    new_rule = _script("new_rule")
    with pytest.raises(ValueError, match="never reused"):
        new_rule.scaffold("PCL101", "another-name", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="already named"):
        new_rule.scaffold("PCL297", "fp16-overflow", "A summary.", directory=tmp_path)
    with pytest.raises(ValueError, match="kebab-case"):
        new_rule.scaffold("PCL297", "Bad Name", "A summary.", directory=tmp_path)
    assert not list(tmp_path.iterdir())
