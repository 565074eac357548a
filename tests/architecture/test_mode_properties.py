"""What the code asks of a precision mode is a property of the Mode (core/numerics.py), not a test of
its name: ``mode == "tf32"`` in eleven modules was the question "does only the dot products' rounding
change, inside the kernel the backend picks?" asked eighteen times."""
from __future__ import annotations

import ast
from typing import Iterator, Tuple

from preclint.core.numerics import MODES
from tests.paths import ROOT

# the one module that may name a mode, and the modules that compare torch's own setting values
# (``fp32_precision = "tf32"``, read from a user's source or from torch), which are no modes
MAY_NAME_TF32 = {"preclint/core/numerics.py",
                 "preclint/text/evidence.py",  # the value a user's source gives fp32_precision
                 "preclint/testing/recording.py"}  # the value torch's fp32_precision holds in a test


def _names_tf32(node: ast.AST) -> bool:
    if isinstance(node, ast.Constant):
        return node.value == "tf32"
    return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(_names_tf32(e) for e in node.elts)


def tf32_comparisons(source: str) -> Iterator[Tuple[int, str]]:
    """(line, text) of each comparison (==, !=, in, not in) with the string "tf32" on either side."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(_names_tf32(side) for side in (node.left, *node.comparators)):
            yield node.lineno, ast.unparse(node)


def test_the_finder_finds_each_form():
    source = 'a = mode == "tf32"\nb = "tf32" != m.name\nc = m in ("tf32", x)\nd = "tf32" in p\ne = {"tf32": 1}\n'
    assert [line for line, _ in tf32_comparisons(source)] == [1, 2, 3, 4]


def test_no_module_tests_a_mode_by_its_name_tf32():
    found = [f"{path.relative_to(ROOT)}:{line}: {text}"
             for path in sorted((ROOT / "preclint").rglob("*.py"))
             if path.relative_to(ROOT).as_posix() not in MAY_NAME_TF32
             for line, text in tf32_comparisons(path.read_text(encoding="utf-8"))]
    assert not found, "ask the Mode (rounds_products_only, kernel_choice_matters): " + "; ".join(found)


def test_only_tf32_rounds_the_products_alone():
    # the properties answer as the name tests did: for tf32 and no other mode
    assert [name for name, mode in MODES.items() if mode.rounds_products_only] == ["tf32"]
    assert [name for name, mode in MODES.items() if mode.kernel_choice_matters] == ["tf32"]
