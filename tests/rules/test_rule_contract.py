"""The rule pack is discovered, and the Rule classes are the whole contract: every module registers a
rule, every hook the engine reads is declared on the base classes, and no code outside the pack names
a rule code."""
from __future__ import annotations

import ast
import importlib
import pathlib
import re

import pytest

from preclint.rules import base as rulebase
from preclint.rules import all_rules, graph_rules, rule_modules, rules_of, source_rules
from preclint.rules.base import MEASURED_AS, Rule, SourceRule
from tests.paths import ROOT

CODE = re.compile(r"^PCL[0-9]{3}$")


@pytest.mark.parametrize("name", rule_modules())
def test_every_rule_module_registers_a_rule(name):
    module = importlib.import_module(f"preclint.rules.{name}")
    assert rules_of(module), f"preclint/rules/{name.replace('.', '/')}.py defines no Rule or SourceRule with a code"


@pytest.mark.parametrize("name", rule_modules())
def test_a_rule_module_holds_one_rule_named_after_it(name):
    """``fp16-overflow`` lives in ``model/fp16_overflow.py``: a rule is found by its name."""
    (rule,) = rules_of(importlib.import_module(f"preclint.rules.{name}"))
    assert name.split(".")[-1] == rule.name.replace("-", "_")
    assert name.split(".")[0] == ("source" if issubclass(rule, SourceRule) else "model")


def test_every_module_file_of_the_pack_is_found():
    pack = ROOT / "preclint" / "rules"
    files = sorted(f"{p.parent.name}.{p.stem}" for kind in ("model", "source") for p in (pack / kind).glob("*.py")
                   if not p.stem.startswith(("_", "__")))
    assert files == rule_modules()


def test_codes_and_names_are_unique():
    rules = graph_rules() + source_rules()
    assert len({r.code for r in rules}) == len(rules) == len(all_rules())
    assert len({r.name for r in rules}) == len(rules)
    for rule in rules:
        assert CODE.match(rule.code) and re.match(r"^[a-z0-9]+(-[a-z0-9]+)*$", rule.name), rule.code


def test_declared_values_are_known():
    from preclint.core.numerics import MODES

    for rule in graph_rules():
        assert rule.measured_as in MEASURED_AS, rule.code
        assert set(rule.precisions) <= set(MODES), rule.code
        if rule.needs_probe:
            assert rule.probe_bad and rule.probe_good, rule.code
    for rule in source_rules():
        assert all(isinstance(group, tuple) and group for group in rule.triggers), rule.code
        if rule.reports_unreadable_files or rule.reports_unused_suppressions:
            assert rule.after_suppressions, rule.code


def test_hooks_the_runners_read_are_declared_on_the_base_classes():
    """A rule may set only what its base class declares (plus its own helpers, which start with _ or
    are methods): an attribute the engine reads with getattr and no default is not part of the contract."""
    declared = set(dir(Rule)) | set(dir(SourceRule))
    declared |= {name for base in (rulebase.RuleDoc, Rule, SourceRule) for name in vars(base).get("__annotations__", {})}
    for rule in graph_rules() + source_rules():
        own = {name for name, value in vars(rule).items()
               if not name.startswith("_") and not callable(value) and not isinstance(value, (classmethod, staticmethod, property))}
        assert own <= declared, (rule.code, own - declared)


def test_the_runner_hooks_each_have_one_rule():
    from preclint.rules import unreadable_file_rule, unused_suppression_rule

    assert unreadable_file_rule().unreadable_file("a.py", "cannot read it").location.path == "a.py"
    assert unused_suppression_rule().unused_suppression(rulebase.Location("a.py", 3, 1), ("PCL101",), ()).location.line == 3


def _code_literals(path: pathlib.Path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and CODE.match(node.value):
            yield node.lineno, node.value


@pytest.mark.slow
def test_no_code_outside_the_pack_names_a_rule_code():
    found = [f"{path.relative_to(ROOT)}:{line}: {code}"
             for path in sorted((ROOT / "preclint").rglob("*.py")) if path.relative_to(ROOT).parts[1:3] not in (("rules", "model"), ("rules", "source"))
             for line, code in _code_literals(path)]
    assert not found, "engine code must read declared rule attributes, not rule codes: " + ", ".join(found)
