"""Where a finding points: the line that made its op, the user's lines that lead there (the call into
a library, the line that builds the module), the model's definition for findings without a line of
their own, and paths as reports print them."""
from __future__ import annotations

import functools
import inspect
import os
from typing import Dict, List, Optional, Sequence

from preclint.core.findings import Finding, Location
from preclint.core.ir import Graph
from preclint.capture.frames import is_internal_file
from preclint.text.lines import file_text
from preclint.text.paths import display_place, library_path


def model_location(loaded) -> Optional[Location]:
    """Where the model is defined, for findings that have no line of their own: its class when the
    model's file defines it, else the line there that defines the name it was loaded as (``model =
    resnet18()``, ``def build():``), else the file's first line."""
    path = loaded.source_path
    if not path:
        return None
    line = None
    cls = type(loaded.module)
    try:
        cls_file = inspect.getsourcefile(cls)
        if cls_file and os.path.abspath(cls_file) == os.path.abspath(path):
            line = _class_line(path, cls) or inspect.getsourcelines(cls)[1]
    except (OSError, TypeError):
        pass
    if line is None:
        line = _top_level_definition(path, loaded.name.rsplit(":", 1)[-1]) or 1
    return Location(path, line, 1)


def model_name(loaded) -> str:
    """What the user's file calls the model, for naming its parts as the user indexes them
    (``net[0]``): the name it was loaded as where the file assigns it an instance, else ``model``."""
    import ast

    name = loaded.name.rsplit(":", 1)[-1]
    statement = _top_level_statement(loaded.source_path, name) if loaded.source_path else None
    return name if isinstance(statement, (ast.Assign, ast.AnnAssign)) else "model"


def _top_level_definition(path: str, name: str) -> Optional[int]:
    """The line of the module-level class, function or assignment that defines ``name`` in ``path``."""
    statement = _top_level_statement(path, name)
    return statement.lineno if statement is not None else None


def _class_line(path: str, cls: type) -> Optional[int]:
    """The line ``inspect.getsourcelines`` gives a module-level class (its first decorator's, or its
    ``class`` line), from the file's tree parsed once; None where another look is needed."""
    import ast

    tree = _module_tree(path)
    if tree is None or cls.__qualname__ != cls.__name__:
        return None
    for stmt in tree.body:
        if isinstance(stmt, ast.ClassDef) and stmt.name == cls.__name__:
            return stmt.decorator_list[0].lineno if stmt.decorator_list else stmt.lineno
    return None


def _module_tree(path: str):
    """The ast of ``path`` (None where it does not parse), parsed once for its text."""

    text = file_text(path)
    return _parsed(text) if text else None


@functools.lru_cache(maxsize=8)
def _parsed(text: str):
    import ast

    try:
        return ast.parse(text)
    except (SyntaxError, ValueError):
        return None


def _top_level_statement(path: str, name: str):
    """The module-level class, function or assignment (an ast statement) that defines ``name``."""
    import ast

    if not name.isidentifier():
        return None
    tree = _module_tree(path)
    if tree is None:
        return None
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and stmt.name == name:
            return stmt
        targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return stmt
    return None


def display_location(location: Location) -> Location:
    """A location as reports print it: relative to the working directory, or, in a library's file,
    to the directory the library is imported from (source.paths.display_place)."""
    if location.library:
        return location

    path, library = display_place(location.path)
    return Location(path, location.line, location.column, library)


def relativize(findings: Sequence[Finding]) -> None:
    for f in findings:
        if f.location is not None:
            f.location = display_location(f.location)
        f.related = tuple((display_location(loc), text) for loc, text in f.related)


def module_definition_locations(root, paths, model_file: Optional[str] = None, model_name: str = "") -> Dict[str, Location]:
    """module path -> the line in the user's code that builds that module.

    A module is built by the nearest enclosing module whose class the user wrote (torchvision's and
    torch's own classes are not the user's code): ``stages.0.depthwise`` is built by the class of
    ``stages.0`` as its ``depthwise`` attribute; a block inside an ``nn.Sequential`` by the class that
    builds the Sequential. Where no class of the user's encloses it (a model of torch's own layers,
    ``model = nn.Sequential(nn.Linear(...), ...)``), by the line of ``model_file`` that builds the
    model ``model_name`` names, or the entry there that builds the module.
    """
    from preclint.locations.definitions import FILE, definition_location  # lazy: libcst only where a source file is parsed

    modules = dict(root.named_modules(remove_duplicate=False))  # a shared module under each of its names
    files: Dict[str, Optional[str]] = {}

    def user_file(path: str) -> Optional[str]:
        if path not in files:
            try:
                source = inspect.getsourcefile(type(modules[path]))
            except (TypeError, OSError):
                source = None
            files[path] = source if source and not is_internal_file(source) else None
        return files[path]

    found: Dict[str, Location] = {}
    for path in paths:
        if path not in modules or not path:
            continue
        parts = path.split(".")
        for cut in range(len(parts) - 1, -1, -1):
            owner = ".".join(parts[:cut])
            source = user_file(owner)
            if source is None:
                continue
            where = definition_location(source, type(modules[owner]).__name__, ".".join(parts[cut:]))
            if where is not None:
                found[path] = where
            break
        else:
            where = definition_location(model_file, FILE, f"{model_name}.{path}") if model_file and model_name else None
            if where is not None:
                found[path] = where
    return found


def attach_source_locations(findings: List[Finding], loaded, graph: Optional[Graph] = None) -> None:
    """Point each finding at the line that made its op, and at the user's lines that lead there.

    The op's line may be a library's (``torchvision/models/resnet.py``): the user's line that calls
    into the library and the line that builds the module (or, failing both, the model's definition)
    then follow as related locations, for the formats meant for code review to annotate. A finding
    with no line of its own goes to the line that builds its module, else stays at the model's
    definition.
    """

    modules = {f.module for f in findings if f.module}
    # nothing to place: don't pay for parsing (or importing libcst)
    definitions = (module_definition_locations(loaded.module, modules, loaded.source_path, loaded.name.rsplit(":", 1)[-1])
                   if modules else {})
    fallback = model_location(loaded)
    for f in findings:
        built = definitions.get(f.module)
        if f.location is None or f.location == fallback:
            f.location = built or f.location
            continue
        related = []
        if library_path(f.location.path) is not None:
            node = graph.get(f.node) if graph is not None and f.node else None
            call = next((loc for loc in (node.stack if node is not None else ()) if library_path(loc.path) is None), None)
            if call is not None:
                library = library_path(f.location.path).split("/", 1)[0].removesuffix(".py")
                related.append((call, f"the call into {library} that reaches {f.module or f.op or 'this op'}"))
            if built is None and call is None and fallback is not None and library_path(fallback.path) is None:
                related.append((fallback, "the model is built here"))
        if built is not None and not any(_same_line(built, loc) for loc in [f.location] + [loc for loc, _ in related]):
            related.append((built, f"{f.module} is built here"))
        f.related = f.related + tuple(related)


def _same_line(a: Location, b: Location) -> bool:
    return (os.path.abspath(a.path), a.line) == (os.path.abspath(b.path), b.line)
