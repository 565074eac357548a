"""A module's dependencies on the rest of preclint are read at its top. An import of preclint inside a
function stays there only for a reason written beside it (``# lazy: <reason>``): a torch-free path
(``import preclint``, the rule pack, the source-only check, ``preclint rule``), the plain check that
loads no probe, measure or plan, libcst only where a source file is parsed, an optional dependency."""
from __future__ import annotations

import ast
from typing import List, Tuple

from tests.architecture.test_architecture import MODULES
from tests.paths import ROOT

MARK = "# lazy:"


def unexplained_local_imports(source: str) -> List[Tuple[int, str]]:
    """(line, import) of each import of preclint inside a function of ``source`` that carries no
    ``# lazy:`` reason on any of its lines."""
    lines = source.splitlines()
    tree = ast.parse(source)
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        for node in ast.walk(function):
            if isinstance(node, ast.Import):
                ours = any(a.name == "preclint" or a.name.startswith("preclint.") for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                ours = node.level > 0 or (node.module or "").split(".")[0] == "preclint"
            else:
                continue
            text = lines[node.lineno - 1: node.end_lineno]
            if ours and not any(MARK in line for line in text):
                found.append((node.lineno, text[0].strip()))
    return sorted(set(found))


def test_every_function_local_import_of_preclint_says_why():
    found = [f"{MODULES[name].relative_to(ROOT)}:{line}: {text}"
             for name in sorted(MODULES)
             for line, text in unexplained_local_imports(MODULES[name].read_text(encoding="utf-8"))]
    assert not found, "move these to the module's top, or say why not with '# lazy: <reason>': " + "; ".join(found)


def test_the_guard_finds_an_unexplained_import_and_passes_an_explained_one():
    source = ("from preclint.core import ir\n"
              "def f():\n"
              "    from preclint.measure import compare\n"
              "    from . import sibling\n"
              "    import preclint.probe  # lazy: the plain check loads no probe/measure/plan\n"
              "    from preclint.text import (\n"
              "        index)  # lazy: libcst only where a source file is parsed\n"
              "    import torch\n"
              "    return lambda: __import__('x')\n")
    assert unexplained_local_imports(source) == [
        (3, "from preclint.measure import compare"), (4, "from . import sibling")]
