"""Every graph rule's documented bad examples raise it and its good examples do not (Fixit style).

The examples live beside each rule, so its documentation and its tests cannot drift apart.
"""
import pytest

from preclint.rules import graph_rules
from tests.helpers import check_example, codes
from tests.snapshots import assert_matches_snapshot, read_snapshot

CASES = [
    pytest.param(rule, kind, i, example, id=f"{rule.code}-{kind}-{i}")
    for rule in graph_rules()
    for kind, examples in (("bad", rule.bad), ("good", rule.good))
    for i, example in enumerate(examples)
]


@pytest.mark.parametrize("rule, kind, index, example", CASES)
def test_rule_example(rule, kind, index, example, update_snapshots):
    report = assert_example(rule, kind, example)
    if kind == "bad":
        assert_matches_snapshot(rule.code, f"bad-{index}", report.findings, update_snapshots)


def test_every_snapshot_entry_is_an_example():
    for rule in graph_rules():
        assert set(read_snapshot(rule.code)) == {f"bad-{i}" for i in range(len(rule.bad))}, rule.code


def assert_example(rule, kind, example):
    """A bad example raises ``rule`` with a message, a fix and its precisions; a good one does not."""
    report, _graph, _ctx = check_example(example)
    found = [f for f in report.findings if f.code == rule.code]
    if kind == "bad":
        assert found, f"{rule.code} should fire on: {example.description}; got {codes(report)}"
        for finding in found:
            assert finding.message and finding.fix
            assert finding.precisions, "a finding names the precisions it concerns"
    else:
        assert not found, f"{rule.code} should not fire on: {example.description}: {[f.message for f in found]}"
    return report


def test_every_graph_rule_has_examples_and_docs():
    for rule in graph_rules():
        if not rule.needs_probe:
            assert rule.bad and rule.good, rule.code
        for section in (rule.why, rule.example, rule.fix, rule.summary):
            assert section.strip(), rule.code
        assert rule.code.startswith("PCL") and len(rule.code) == 6
