"""The output formats: one module each in this package, found by walking it, so that a new format is
one new module with nothing to register. A format module is named after its format and defines

    NAME         what ``--output-format`` and ``output-format = "..."`` take (the module's name)
    LABEL        how ``--output-format``'s help names it (the name, and a word on it where one helps)
    SUMMARY      one line for the docs' table of formats (docs/output-formats.md)
    DOCUMENT     True for a document in an encoding of its own: written as UTF-8 on any stdout
    ORDER        its place in every listing (the help, the configuration's error, the docs)
    render_many(reports, *, color=False) -> str: the reports of one run as one output

Walking the package imports every format module, for the command line's choices and help: a module
imports its writer (rich, the HTML page) inside ``render_many``, so that listing the formats loads none.
"""
from __future__ import annotations

import functools
import importlib
import pkgutil
from types import ModuleType
from typing import Dict, FrozenSet, Tuple

DECLARED = ("NAME", "LABEL", "SUMMARY", "DOCUMENT", "ORDER", "render_many")


@functools.lru_cache(maxsize=None)
def _discovered() -> Tuple[ModuleType, ...]:
    found = [importlib.import_module(f"{__name__}.{info.name}") for info in pkgutil.iter_modules(__path__)
             if not info.name.startswith("_")]
    return tuple(sorted(found, key=lambda module: (module.ORDER, module.NAME)))


def formats() -> Dict[str, ModuleType]:
    """Every output format's module by its name, in listing order."""
    return {module.NAME: module for module in _discovered()}


def names() -> Tuple[str, ...]:
    """The format names ``--output-format`` takes, in listing order."""
    return tuple(formats())


def help_text() -> str:
    """What ``--output-format``'s help says: each format's label, in listing order."""
    return ", ".join(module.LABEL for module in _discovered())


def document_formats() -> FrozenSet[str]:
    """The formats that are documents in an encoding of their own (UTF-8 on any stdout)."""
    return frozenset(module.NAME for module in _discovered() if module.DOCUMENT)


def format_named(name: str) -> ModuleType:
    try:
        return formats()[name]
    except KeyError:
        raise ValueError(name) from None
