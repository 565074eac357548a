"""Where a model file builds and calls its submodules, for pointing graph findings at the user's code.

``locate_definitions(path)`` parses the file once with libcst (never imports it) and maps
``(class name, attribute)`` to the line that builds the attribute in that class:

    class Block(nn.Module):
        def __init__(self):
            self.conv2 = nn.Conv2d(64, 64, 3)          -> ("Block", "conv2")
            self.layers = nn.Sequential(
                nn.Conv2d(3, 8, 3),                     -> ("Block", "layers.0")
                nn.ReLU(),                              -> ("Block", "layers.1")
            )                                           and ("Block", "layers") -> the assignment
            setattr(self, "head", nn.Linear(8, 2))      -> ("Block", "head")
            self.add_module("proj", nn.Linear(8, 8))    -> ("Block", "proj")

    model = nn.Sequential(                          -> ("", "model"): the file's top level
        nn.Linear(8, 8),                            -> ("", "model.0")
    )
    def build(): return nn.Sequential(...)          -> ("", "build"), ("", "build.0"), ...

Entries of ``nn.Sequential(...)``, ``nn.ModuleList([...])`` and ``nn.ModuleDict({...})`` written out
literally get their own line; any other entry (``nn.Sequential(*layers)``, a comprehension) resolves to
the assignment line through ``definition_location``. ``locate_calls`` maps the same keys to the lines
that call ``self.<attr>(...)`` outside ``__init__`` (the line in ``forward``). Paths in the Locations
are relative to the working directory.
"""
from __future__ import annotations

import functools
import os
from typing import Dict, List, Optional, Tuple

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from preclint.core.findings import Location
from preclint.text.index import dotted_name
from preclint.text.paths import display_path
from preclint.text.guard import run_with_deep_stack
from preclint.text.sourcefile import ParseFailure, SourceFile

Key = Tuple[str, str]
FILE = ""  # the class name of the keys of the file's top level: ("", "model"), ("", "model.0")
CONTAINERS = ("Sequential", "ModuleList", "ModuleDict", "ParameterList", "ParameterDict")
REGISTER = ("add_module", "register_module")


class _Locator(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, path: str):
        super().__init__()
        self.path = path
        self.classes: List[str] = []
        self.methods: List[Tuple[str, str]] = []  # (method name, name of its first parameter)
        self.definitions: Dict[Key, Location] = {}
        self.calls: Dict[Key, List[Location]] = {}
        self._init_keys: set = set()  # keys defined in __init__

    def _loc(self, node: cst.CSTNode) -> Location:
        start = self.get_metadata(PositionProvider, node).start
        return Location(self.path, start.line, start.column + 1)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node.name.value)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        params = node.params.params
        self.methods.append((node.name.value, params[0].name.value if params else ""))

    def leave_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.methods.pop()

    def _self_name(self) -> Optional[str]:
        # only methods directly in a class body: a nested helper's ``self`` is not the module
        if not self.classes or not self.methods:
            return None
        return self.methods[-1][1] or None

    def _define(self, attr: str, node: cst.CSTNode, value: Optional[cst.BaseExpression], klass: Optional[str] = None) -> None:
        key = (self.classes[-1] if klass is None else klass, attr)
        # the first assignment in __init__ wins over later re-assignments and other methods
        in_init = bool(self.methods) and self.methods[-1][0] == "__init__"
        if key not in self.definitions or (in_init and key not in self._init_keys):
            self.definitions[key] = self._loc(node)
            if in_init:
                self._init_keys.add(key)
            if value is not None:
                self._entries(attr, value, key[0])

    def _entries(self, attr: str, value: cst.BaseExpression, klass: str) -> None:
        """Literal entries of a container module: ``attr.0``, ``attr.1``, ... or ``attr.<key>``."""
        if not isinstance(value, cst.Call):
            return
        name = (dotted_name(value.func) or "").rsplit(".", 1)[-1]
        if name not in CONTAINERS:
            return
        args = value.args
        if name == "Sequential" and args and all(a.keyword is None and not a.star for a in args):
            items = [a.value for a in args]
            if len(items) == 1 and isinstance(items[0], cst.Call) and (dotted_name(items[0].func) or "").endswith("OrderedDict"):
                self._dict_entries(attr, items[0].args[0].value if items[0].args else None, klass)
                return
            for i, item in enumerate(items):
                self.definitions.setdefault((klass, f"{attr}.{i}"), self._loc(item))
        elif name in ("ModuleList", "ParameterList") and args and isinstance(args[0].value, (cst.List, cst.Tuple)):
            for i, element in enumerate(args[0].value.elements):
                if isinstance(element, cst.StarredElement):
                    return
                self.definitions.setdefault((klass, f"{attr}.{i}"), self._loc(element.value))
        elif name in ("ModuleDict", "ParameterDict") and args:
            self._dict_entries(attr, args[0].value, klass)

    def _dict_entries(self, attr: str, value: Optional[cst.BaseExpression], klass: str) -> None:
        if isinstance(value, cst.Dict):
            for element in value.elements:
                if isinstance(element, cst.DictElement) and isinstance(element.key, cst.SimpleString):
                    self.definitions.setdefault((klass, f"{attr}.{element.key.evaluated_value}"), self._loc(element.value))
        elif isinstance(value, (cst.List, cst.Tuple)):  # OrderedDict([("conv", ...), ...])
            for element in value.elements:
                pair = element.value
                if isinstance(pair, cst.Tuple) and len(pair.elements) == 2 and isinstance(pair.elements[0].value, cst.SimpleString):
                    key = pair.elements[0].value.evaluated_value
                    self.definitions.setdefault((klass, f"{attr}.{key}"), self._loc(pair.elements[1].value))

    def _attr_of_self(self, target: cst.BaseExpression) -> Optional[str]:
        me = self._self_name()
        if me and isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == me:
            return target.attr.value
        return None

    def visit_Assign(self, node: cst.Assign) -> None:
        if not self.classes and not self.methods:  # ``model = nn.Sequential(...)`` at the top level
            for target in node.targets:
                if isinstance(target.target, cst.Name):
                    self._define(target.target.value, target.target, node.value, klass=FILE)
            return
        for target in node.targets:
            attr = self._attr_of_self(target.target)
            if attr:
                self._define(attr, target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        attr = self._attr_of_self(node.target)
        if attr and node.value is not None:
            self._define(attr, node.target, node.value)

    def visit_Return(self, node: cst.Return) -> None:
        # a top-level factory, ``def build(): return nn.Sequential(...)``: what it returns is the model
        if not self.classes and len(self.methods) == 1 and node.value is not None:
            self._define(self.methods[0][0], node, node.value, klass=FILE)

    def visit_Call(self, node: cst.Call) -> None:
        me = self._self_name()
        if not me:
            return
        func = node.func
        # setattr(self, "name", module) / self.add_module("name", module)
        if isinstance(func, cst.Name) and func.value == "setattr" and len(node.args) >= 3:
            owner, name, value = (a.value for a in node.args[:3])
            if isinstance(owner, cst.Name) and owner.value == me and isinstance(name, cst.SimpleString):
                self._define(name.evaluated_value, node, value)
            return
        if isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == me:
            if func.attr.value in REGISTER and len(node.args) >= 2 and isinstance(node.args[0].value, cst.SimpleString):
                self._define(node.args[0].value.evaluated_value, node, node.args[1].value)
            elif self.methods[-1][0] != "__init__":
                self.calls.setdefault((self.classes[-1], func.attr.value), []).append(self._loc(node))


@functools.lru_cache(maxsize=64)
def _locate(filename: str, mtime: float, cwd: str) -> Tuple[Dict[Key, Location], Dict[Key, List[Location]]]:
    try:
        source = SourceFile.read(filename, display_path(filename, cwd))
    except OSError:  # gone, unreadable, or no regular file
        return {}, {}

    def locate():
        locator = _Locator(source.path)
        MetadataWrapper(source.module, unsafe_skip_copy=True).visit(locator)
        return locator.definitions, locator.calls

    try:
        return run_with_deep_stack(locate)  # parsing is guarded, as for the source rules
    except (ParseFailure, RecursionError, MemoryError):
        return {}, {}


def _parsed(path: str):
    filename = os.path.abspath(path)
    try:
        mtime = os.stat(filename).st_mtime
    except OSError:
        return {}, {}
    return _locate(filename, mtime, os.getcwd())


def locate_definitions(path: str) -> Dict[Key, Location]:
    """``(class name, attribute path)`` -> Location of the line that builds it; {} for a file that
    cannot be read or parsed. Parsed once per file and modification time."""
    return dict(_parsed(path)[0])


def locate_calls(path: str) -> Dict[Key, List[Location]]:
    """``(class name, attribute)`` -> Locations of ``self.<attr>(...)`` calls outside ``__init__``."""
    return {key: list(value) for key, value in _parsed(path)[1].items()}


def definition_location(path: str, class_name: str, attr: str) -> Optional[Location]:
    """Where ``class_name`` builds ``attr`` (``"conv2"``, ``"layers.3"``, ``"layers.3.conv"``): the
    deepest prefix of the dotted path that the class builds itself, e.g. the ``self.layers = ...``
    line for an entry of an ``nn.Sequential(*blocks)``."""
    definitions = _parsed(path)[0]
    parts = attr.split(".")
    for n in range(len(parts), 0, -1):
        found = definitions.get((class_name, ".".join(parts[:n])))
        if found is not None:
            return found
    return None
