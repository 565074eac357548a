"""A report's notes are typed records (core.notes.Note: a kind and a text), never bare strings: every
place that adds to a list of notes gives the note's kind, so a reader picks the probe's or the noise
floor's notes by kind instead of by their words. Read statically from every module of preclint."""
import ast
from typing import Iterator, List, Tuple

from preclint.core.notes import KINDS, Note
from tests.paths import ROOT

import pytest

# Documents of their own, with their own string notes and formats: the plan (plan/document.Plan) and
# the checkpoint diff (diff/); neither is a check's report.
OWN_DOCUMENTS = ("preclint/plan/", "preclint/diff/")


def modules() -> Iterator[Tuple[str, ast.AST]]:
    for path in sorted((ROOT / "preclint").rglob("*.py")):
        shown = str(path.relative_to(ROOT))
        if not shown.startswith(OWN_DOCUMENTS):
            yield shown, ast.parse(path.read_text(encoding="utf-8"))


def _name(node: ast.AST) -> str:
    """The last name of ``notes``, ``result.notes``, ``self.session.notes``; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _is_notes(node: ast.AST) -> bool:
    return _name(node).endswith("notes")


def bare_string(node: ast.AST) -> bool:
    """An expression that is text itself: a literal, an f-string, a sum with one, a ``str.join``."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.JoinedStr):
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        return bare_string(node.left) or bare_string(node.right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in ("join", "format"):
        return bare_string(node.func.value)
    if isinstance(node, ast.IfExp):
        return bare_string(node.body) or bare_string(node.orelse)
    return False


def _items(node: ast.AST) -> List[ast.AST]:
    """The elements a list-like expression adds: a list or tuple's, a comprehension's, a sum's."""
    if isinstance(node, (ast.List, ast.Tuple)):
        return list(node.elts)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp)):
        return [node.elt]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _items(node.left) + _items(node.right)
    if isinstance(node, ast.Starred):
        return _items(node.value)
    return []


def added_notes(tree: ast.AST) -> Iterator[Tuple[int, ast.AST]]:
    """(line, expression) for each note added to a list named ``*notes``: ``append``, ``insert``,
    ``extend``, ``+=``, an assignment, and a ``notes=`` argument."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_notes(node.func.value):
            method, args = node.func.attr, node.args
            if method == "append" and args:
                yield node.lineno, args[0]
            elif method == "insert" and len(args) == 2:
                yield node.lineno, args[1]
            elif method == "extend" and args:
                yield from ((node.lineno, item) for item in _items(args[0]))
        if isinstance(node, ast.Call):
            for keyword in node.keywords:
                if keyword.arg is not None and keyword.arg.endswith("notes"):
                    yield from ((node.lineno, item) for item in _items(keyword.value))
        if isinstance(node, ast.AugAssign) and _is_notes(node.target):
            yield from ((node.lineno, item) for item in _items(node.value))
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_notes(t) for t in targets):
                yield from ((node.lineno, item) for item in _items(node.value))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.endswith("notes"):
            # what a function named ``*notes`` returns in a list: the notes it makes
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and inner.value is not None:
                    values = inner.value.elts if isinstance(inner.value, ast.Tuple) else [inner.value]
                    yield from ((inner.lineno, item) for value in values for item in _items(value))


def test_no_place_adds_a_bare_string_note():
    found = [f"{path}:{line}: {ast.unparse(item)[:80]}" for path, tree in modules()
             for line, item in added_notes(tree) if bare_string(item)]
    assert not found, "a report's note is a Note(kind, text) (preclint/core/notes.py):\n" + "\n".join(found)


def test_the_check_finds_a_bare_string_note():
    tree = ast.parse("def f(report, notes):\n"
                     "    report.notes.append(f'{report}: skipped')\n"
                     "    notes += ['the reference ran in float32']\n"
                     "    notes.extend(f'warning at {w}' for w in report.warnings)\n"
                     "    report.notes = list(report.notes) + ['one more']\n"
                     "    make(notes=['drawn'])\n"
                     "    notes.append(Note('load', 'typed'))\n"
                     "def output_notes(output):\n"
                     "    return ['the model returns no tensor' if output is None else 'typed']\n")
    assert sorted(line for line, item in added_notes(tree) if bare_string(item)) == [2, 3, 4, 5, 6, 9]


def test_every_kind_is_given_somewhere_and_none_outside_the_list():
    given = set()
    for path, tree in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _name(node.func) == "Note" and node.args \
                    and isinstance(node.args[0], ast.Constant):
                given.add(node.args[0].value)
    assert given <= set(KINDS), sorted(given - set(KINDS))
    assert set(KINDS) <= given, f"kinds no note is made with: {sorted(set(KINDS) - given)}"


def test_a_note_of_an_unknown_kind_or_no_text_is_refused():
    with pytest.raises(ValueError, match="unknown note kind 'probes'"):
        Note("probes", "probe: emulated")
    with pytest.raises(TypeError):
        Note("probe", ["probe: emulated"])  # type: ignore[arg-type]
    assert Note("probe", "emulated").prefixed("probe: ") == Note("probe", "probe: emulated")
