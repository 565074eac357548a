"""Dependencies point one way: load -> capture -> reference -> predict -> rules -> probe -> report, with
the engine and the command line on top. Read statically from every import in preclint (function-local
ones included, those under ``if TYPE_CHECKING:`` excluded), so a cycle fails here before it fails
at import time in some order nobody tried."""
from __future__ import annotations

import pytest

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple
from tests.paths import ROOT

PACKAGES = {"preclint": ROOT / "preclint"}

# Lowest first, one entry a folder: a module imports from its own layer and those below, never from
# above. An entry names a module, or with ".*" a package and every module under it.
LAYERS: List[Tuple[str, ...]] = [
    ("preclint", "preclint.core.*"),
    ("preclint.text.*",),  # reading files safely, and source files without running them (the standard library, libcst)
    ("preclint.policy",),  # what a deployed model imports: torch and text.safe_io only
    ("preclint.training.*",),  # training-step statistics of tensors in a format (torch only): a live monitor's too
    ("preclint.load.*",),
    ("preclint.capture.*",),
    ("preclint.measure.*",),  # running a model under a precision and comparing it: no rules, no predictions
    ("preclint.reference.*",),
    ("preclint.predict.*",),
    ("preclint.locations.*",),
    ("preclint.rules", "preclint.rules.*"),
    ("preclint.probe.*",),
    ("preclint.report.*",),
    ("preclint.config",),  # validates codes against the rule pack, and output-format against the formats found
    ("preclint.source.*",),  # the source-only check: runs the source rules, prints a report
    ("preclint.plan.*",),  # the planner, its verification and its output: the session drives it
    ("preclint.engine",),  # the session: one model's walk, for the command line and the Python API
    ("preclint.api",),  # the Python API: preclint.check and its Report, on the session
    ("preclint.testing.*",),  # tolerances for tests and an assert_close that explains, on the API
    ("preclint.diff.*",),  # two models (or two settings) walked by the session and compared, layer by layer
    ("preclint.cli", "preclint.__main__"),
]


def modules() -> Dict[str, pathlib.Path]:
    found = {}
    for package, directory in PACKAGES.items():
        for path in directory.rglob("*.py"):
            parts = list(path.relative_to(directory).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package] + parts)] = path
    return found


MODULES = modules()


def _type_checking_only(tree: ast.AST) -> Set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            ids |= {id(inner) for stmt in node.body for inner in ast.walk(stmt)}
    return ids


def imports(name: str) -> Iterator[Tuple[str, List[str], int]]:
    """(module imported, names imported from it, line) for each import of module ``name``."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _type_checking_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, [], node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            yield base, [alias.name for alias in node.names], node.lineno


def _resolve(target: str) -> str:
    while target and target not in MODULES:
        target = target.rpartition(".")[0]
    return target


def dependencies() -> Dict[str, Dict[str, int]]:
    """module -> {preclint module it imports: line}; ``from package import module`` counts the module."""
    graph: Dict[str, Dict[str, int]] = {}
    for name in MODULES:
        edges = graph.setdefault(name, {})
        for module, names, line in imports(name):
            targets = [f"{module}.{n}" if f"{module}.{n}" in MODULES else module for n in names] or [module]
            for target in map(_resolve, targets):
                if target and target != name:
                    edges.setdefault(target, line)
    return graph


def cycles(graph: Dict[str, Dict[str, int]]) -> List[List[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_of(module: str):
    best, best_len = None, -1
    for i, layer in enumerate(LAYERS):
        for entry in layer:
            if entry == module and len(entry) + 1 > best_len:
                best, best_len = i, len(entry) + 1
            elif (entry.endswith(".*") and (module + ".").startswith(entry[:-1])
                  and len(entry) - 2 > best_len):
                best, best_len = i, len(entry) - 2
    return best


@pytest.mark.slow
def test_no_import_cycle_between_modules():
    found = cycles(dependencies())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def folder_of(module: str) -> str:
    """The package a module belongs to, one level below preclint (``preclint.rules.model`` and
    ``preclint.rules.source`` count apart); top-level modules are their own folder."""
    parts = module.split(".")
    depth = 3 if parts[1:2] == ["rules"] and parts[2:3] in (["model"], ["source"]) else 2
    return ".".join(parts[:depth])


@pytest.mark.slow
def test_no_import_cycle_between_folders():
    folders: Dict[str, Dict[str, int]] = {}
    for module, edges in dependencies().items():
        mine = folders.setdefault(folder_of(module), {})
        for target, line in edges.items():
            if folder_of(target) != folder_of(module):
                mine.setdefault(folder_of(target), line)
    found = cycles(folders)
    assert not found, "folders that import each other: " + "; ".join(" <-> ".join(c) for c in found)


def test_every_module_is_in_a_layer():
    assert [name for name in MODULES if layer_of(name) is None] == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []


@pytest.mark.slow
def test_dependencies_point_down_the_layers():
    wrong = []
    for module, edges in dependencies().items():
        mine = layer_of(module)
        for target, line in edges.items():
            theirs = layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                wrong.append(f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}")
    assert not wrong, "a stage reaches up: " + "; ".join(sorted(wrong))


def test_the_stages_of_the_pipeline_are_in_order():
    order = ["preclint.load.loader", "preclint.capture.graph", "preclint.reference.statistics_pass",
             "preclint.predict.error_model", "preclint.rules", "preclint.probe", "preclint.report", "preclint.engine",
             "preclint.cli"]
    layers = [layer_of(m) for m in order]
    assert layers == sorted(layers) and None not in layers


@pytest.mark.slow
def test_no_private_name_is_imported_from_another_module():
    found = [
        f"{MODULES[name].relative_to(ROOT)}:{line}: {n} from {module}"
        for name in MODULES for module, names, line in imports(name)
        if module.startswith("preclint") and _resolve(module) != name
        for n in names if n.startswith("_") and not n.startswith("__")
    ]
    assert not found, "private names used across modules: " + "; ".join(found)


# what code outside the rule pack may import of it: the pack (its discovery) and the contract a rule
# implements; a rule module, or a helper the pack's rules share (``rules/model/_scaled.py``), is the pack's own
RULE_PACK_SURFACE = ("preclint.rules", "preclint.rules.base")


def test_only_the_pack_imports_its_rule_modules():
    found = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
             for module, edges in dependencies().items()
             if module != "preclint.rules" and not module.startswith("preclint.rules.")
             for target, line in edges.items()
             if target.startswith("preclint.rules.") and target not in RULE_PACK_SURFACE]
    assert not found, "outside the rule pack, numbers a rule and the engine share belong in predict/ or core/: " + \
        "; ".join(sorted(found))


def test_the_rule_contract_stands_without_the_built_in_rules():
    # an installed pack (docs/rule-packs.md) builds on preclint.rules.base and is found by preclint.rules:
    # neither may lean on a built-in rule module, so a pack sees the contract, not the built-in rules' helpers
    found = [f"{MODULES[module].relative_to(ROOT)}:{line} imports {target}"
             for module in RULE_PACK_SURFACE for target, line in dependencies()[module].items()
             if target.startswith(("preclint.rules.model.", "preclint.rules.source."))]
    assert not found, "; ".join(sorted(found))


def parameters(function: ast.AST) -> List[str]:
    """A function's parameters, ``self`` and ``cls`` left out."""
    a = function.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    names += [p.arg for p in (a.vararg, a.kwarg) if p is not None]
    return [n for n in names if n not in ("self", "cls")]


def long_parameter_lists(source: str, most: int = 7) -> List[Tuple[str, int, int]]:
    """(function, line, parameters) of each function in ``source`` that takes more than ``most``."""
    return [(node.name, node.lineno, len(parameters(node))) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(parameters(node)) > most]


def test_no_function_in_the_probe_takes_more_than_seven_parameters():
    # the probe's state lives in objects (the passes every mode shares, a mode's pending figures, a
    # sweep, a runner): a long positional list is state nobody owns, passed on in an order every
    # caller must keep; the runs it measures (measure/) are held to the same
    found = [f"{MODULES[name].relative_to(ROOT)}:{line} {function} takes {count}"
             for name in MODULES for package in ("preclint.probe", "preclint.measure")
             if name == package or name.startswith(package + ".")
             for function, line, count in long_parameter_lists(MODULES[name].read_text(encoding="utf-8"))]
    assert not found, "functions with more than 7 parameters: " + "; ".join(found)


def test_the_parameter_count_leaves_out_self_and_counts_the_rest():
    source = "class A:\n    def m(self, a, b, *c, d, **e): pass\ndef f(a, b, c, d, e, f, g, h): pass\n"
    assert sorted(long_parameter_lists(source, most=4)) == [("f", 3, 8), ("m", 2, 5)]
    assert long_parameter_lists(source) == [("f", 3, 8)]


def positional_parameter_counts(source: str) -> List[Tuple[str, int, int]]:
    """(function, line, parameters a caller may pass by position) of each function in ``source``,
    ``self`` and ``cls`` left out; ``*args`` counts as none."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names = [p.arg for p in node.args.posonlyargs + node.args.args]
            found.append((node.name, node.lineno, len([n for n in names if n not in ("self", "cls")])))
    return found


def test_the_positional_count_stops_at_the_star():
    source = "class A:\n    def m(self, a, b, *, c): pass\ndef f(a, /, b, *rest, c, d, **e): pass\n"
    assert sorted(positional_parameter_counts(source)) == [("f", 3, 2), ("m", 2, 2)]


MOST_LINES = 600  # one job a module: past it a module held several (loader.py was 1,032 lines of five)
MOST_POSITIONAL = 6  # past it, an argument's meaning is its place in a list every caller must keep


def test_no_module_is_longer_than_six_hundred_lines():
    found = [f"{path.relative_to(ROOT)} has {lines} lines" for path in MODULES.values()
             if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MOST_LINES]
    assert not found, "; ".join(found)


@pytest.mark.slow
def test_no_function_takes_more_than_six_parameters_by_position():
    found = [f"{MODULES[name].relative_to(ROOT)}:{line} {function} takes {count} by position"
             for name in MODULES
             for function, line, count in positional_parameter_counts(MODULES[name].read_text(encoding="utf-8"))
             if count > MOST_POSITIONAL]
    assert not found, "; ".join(found)


# the stages of one model's walk, and the probe's ranks: the session (preclint.engine) drives them;
# the command line names the probe's options (``preclint.probe``), never its parts
WALK = ("preclint.capture.graph", "preclint.reference", "preclint.predict", "preclint.locations", "preclint.measure",
        "preclint.plan.planner", "preclint.plan.verify", "preclint.probe.")


def test_the_command_line_parses_and_calls_the_session():
    found = sorted({f"preclint/cli.py:{line} imports {target}"
                    for module, names, line in imports("preclint.cli")
                    for target in map(_resolve, [f"{module}.{n}" if f"{module}.{n}" in MODULES else module
                                                 for n in names] or [module])
                    if any(target == w or target.startswith(w if w.endswith(".") else w + ".") for w in WALK)})
    assert not found, "the command line walks a model itself: " + "; ".join(found)
