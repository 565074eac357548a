"""The source check's work grows linearly with a file's closeness checks, not with their square.

A 1 MB test file of closeness checks took 156 s (5 MB more than 300 s): every check scanned all the
assignments of the file (``_integer_valued``, the data flow's ``_feeding``), and every finding's
statement was searched for in the whole text. These tests count work, not seconds: how often the
rules read an assignment, and how many characters of the text are compared while placing findings,
for a file and for one with twice the checks. Twice the checks must cost about twice the work, where
the old steps cost four times as much. Python's cyclic collector, which walks libcst's whole tree at
each full collection, is paused while a file is checked. And a file of 2,000 checks gets its findings
right.
"""
from __future__ import annotations

import gc

import pytest

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from preclint.config import Config
from preclint.text.index import AssignSite, descendants
from preclint.text.positions import Positions
from preclint.source.run import _active, _check_source, check_text, selected_rules
from preclint.text.sourcefile import SourceFile


def checks_file(functions: int, checks: int = 2):
    """A pytest file: ``functions`` tests, every fourth in float16, each with ``checks`` pairs of
    closeness checks with tolerances float16 cannot meet (distinct lines); and the lines of the
    checks in float16 tests, where the findings are."""
    lines = ["import torch"]
    fp16_checks = []
    for i in range(functions):
        dtype = "torch.float16" if i % 4 == 0 else "torch.float32"
        lines += ["", "", f"def test_case_{i}():", f"    a = torch.randn(4, 4, dtype={dtype})", "    b = a.clone()",
                  f"    x = torch.ones(3, dtype={dtype})", "    y = x * 2"]
        for k in range(checks):
            lines += [f"    torch.testing.assert_close(a, b, rtol={k + 1}e-7, atol=0)",
                      f"    assert torch.allclose(x, y, atol={k + 1}e-9)"]
            if dtype == "torch.float16":
                fp16_checks += [len(lines) - 1, len(lines)]
    return "\n".join(lines) + "\n", fp16_checks


class _CountingAssignSite(AssignSite):
    """An assignment of the index that counts how often the rules read it."""

    reads = 0

    def __getattribute__(self, name):
        _CountingAssignSite.reads += 1
        return super().__getattribute__(name)


def _assignments_read(text: str) -> int:
    """How often the source rules read an assignment of the file's index while checking ``text``."""
    source = SourceFile("test_checks.py", text)
    rules = _active([rule() for rule in selected_rules(Config())], source)
    for assign in source.index.assigns:
        assign.__class__ = _CountingAssignSite
    _CountingAssignSite.reads = 0
    assert _check_source(source, rules)
    return _CountingAssignSite.reads


@pytest.mark.slow
def test_twice_the_checks_read_the_assignments_about_twice():
    small, large = (_assignments_read(checks_file(n)[0]) for n in (40, 80))
    # every check scanning every assignment of the file made this 4; linear is 2
    assert large < 2.6 * small, (small, large)


class _CountingText(str):
    """A text that counts the characters its searches and comparisons may examine."""

    examined = 0

    def find(self, sub, start=0, end=None):
        _CountingText.examined += len(self) - (start or 0)
        return super().find(sub, start, end if end is not None else len(self))

    def startswith(self, prefix, start=0, end=None):
        _CountingText.examined += len(prefix) if isinstance(prefix, str) else sum(map(len, prefix))
        return super().startswith(prefix, start, end if end is not None else len(self))


def _examined_placing_every_check(text: str) -> int:
    module = cst.parse_module(text)
    _CountingText.examined = 0
    positions = Positions(module, _CountingText(text))
    calls = [node for node in descendants(module) if isinstance(node, cst.Call)]
    for call in calls:
        positions[call]
    return _CountingText.examined


@pytest.mark.slow
def test_placing_twice_the_findings_examines_about_twice_the_text():
    small, large = (_examined_placing_every_check(checks_file(n)[0]) for n in (100, 200))
    # a search of the whole text for each statement made this 4
    assert large < 2.6 * small, (small, large)


def test_whole_module_positions_are_libcsts():
    # past its budget, Positions answers from the whole module's code, generated once by preclint's
    # own codegen state: the positions must be libcst's PositionProvider's
    text = checks_file(12)[0] + "class A:\n    # about f\n    @staticmethod\n    def f(x):\n        return x.half()\n"
    module = cst.parse_module(text)
    expected = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = Positions(module, text)
    positions.budget = 0
    nodes = [node for node in descendants(module) if node is not module]
    for node in nodes:
        assert positions[node] == expected[node], node
    assert positions._whole is not None


@pytest.mark.slow
def test_a_file_of_2000_checks_gets_its_findings():
    text, fp16_checks = checks_file(200, 5)  # 200 tests of five pairs of checks: 2,000 checks
    findings = check_text(text, "tests/test_checks.py")
    assert len(fp16_checks) == 500
    assert sorted(f.location.line for f in findings) == fp16_checks
    assert {f.code for f in findings} == {"PCL501"}
    assert [f.location.column for f in sorted(findings, key=lambda f: f.location.line)] == [5, 12] * 250
    assert all("fp16" in f.message for f in findings)


def test_the_collector_is_paused_while_a_file_is_checked(monkeypatch):
    from preclint.rules.source.tolerance_below_resolution import ToleranceBelowResolution

    collecting = []
    check = ToleranceBelowResolution.check_source

    def spy(self, source):
        collecting.append(gc.isenabled())
        yield from check(self, source)

    monkeypatch.setattr(ToleranceBelowResolution, "check_source", spy)
    assert gc.isenabled()
    text, fp16_checks = checks_file(8)
    assert sorted(f.location.line for f in check_text(text, "tests/test_checks.py")) == fp16_checks
    assert collecting == [False] and gc.isenabled()
