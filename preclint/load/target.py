"""Importing the target the user named: a Python file (``model.py``, ``model.py:Net``) or an importable
module (``package.module``, ``package.module:attr``), seeded, with the user's sibling imports found."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import itertools
import os
import re
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Iterator, Optional

import torch

from preclint.core.errors import UserError, first_line
from preclint.load.messages import check_is_file, located, path_label, quote

# Each loaded file gets its own module name, so loading two files called model.py never collides.
_module_counter = itertools.count()


@dataclass
class Origin:
    """Where the model comes from, in the words the messages use."""

    namespace: ModuleType
    label: str  # "path/model.py" or "torchvision.models"
    file_path: Optional[str]  # absolute path for file targets; None for module targets


def import_target(target: str, seed: int) -> tuple[Origin, Optional[str]]:
    """Import the file or module that ``target`` names; return it and the ``:attr`` part, if any."""
    if not target or not target.strip():
        raise UserError("no target given: expected a Python file (model.py) or package.module[:attr]")

    # An existing path wins over any reading of a colon in it (C:\models\net.py, odd names).
    if os.path.exists(target):
        return _import_file(target, seed), None

    head, colon, attr = target.rpartition(":")
    if colon:
        if not attr:
            raise UserError(f"{target}: nothing after ':'; expected FILE.py:NAME or package.module:NAME")
        if _looks_like_path(head):
            return _import_file(head, seed), attr
        return _import_module(head, seed), attr

    if _looks_like_path(target):
        return _import_file(target, seed), None  # raises "no such file"
    return _import_module(target, seed), None


def _looks_like_path(text: str) -> bool:
    # An existing directory does not count: `mypkg:net` run beside the mypkg/ package is a module.
    return (
        text.endswith(".py")
        or os.sep in text
        or (os.altsep is not None and os.altsep in text)
        or os.path.isfile(text)
    )


def _import_file(path: str, seed: int) -> Origin:
    if os.path.isdir(path):
        raise UserError(f"{path}: is a directory; expected a Python file (model.py) or package.module[:attr]")
    check_is_file(path, what="file")
    label = path_label(path)
    if not path.endswith(".py"):
        raise UserError(
            f"{label}: not a Python file; name the .py file that defines the model "
            "(pass a checkpoint with --weights)"
        )
    abs_path = os.path.abspath(path)
    directory = os.path.dirname(abs_path)
    stem = re.sub(r"\W", "_", os.path.splitext(os.path.basename(abs_path))[0])
    module_name = f"_preclint_model_{stem}_{next(_module_counter)}"

    loader = importlib.machinery.SourceFileLoader(module_name, abs_path)
    spec = importlib.util.spec_from_file_location(module_name, abs_path, loader=loader)
    assert spec is not None  # a SourceFileLoader and a path always make a spec
    namespace = importlib.util.module_from_spec(spec)
    # Registered for good: inspect, pickle and dataclasses look classes up through sys.modules.
    sys.modules[module_name] = namespace

    try:
        with _on_sys_path(directory):
            torch.manual_seed(seed)  # module-level code may build the model or random inputs
            loader.exec_module(namespace)
    except SyntaxError as exc:
        del sys.modules[module_name]
        where = path_label(exc.filename) if exc.filename else label
        line = f":{exc.lineno}" if exc.lineno else ""
        raise UserError(f"{where}{line}: syntax error: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        del sys.modules[module_name]
        raise UserError(
            f"{located(label, abs_path, exc.__traceback__)}: importing the file failed: {quote(exc)}"
        ) from None
    return Origin(namespace=namespace, label=label, file_path=abs_path)


def _import_module(name: str, seed: int) -> Origin:
    if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
        raise UserError(
            f"no such file: {name} (and {name!r} is not a module name either; "
            "expected a Python file or package.module[:attr])"
        )
    try:
        # The console script does not put the working directory on sys.path; users expect
        # `preclint check mypkg.models:net` to find ./mypkg, as uvicorn and gunicorn do.
        with _on_sys_path(os.getcwd()):
            torch.manual_seed(seed)
            namespace = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserError(f"cannot import module {name!r}: {first_line(exc) or type(exc).__name__}") from None
        raise UserError(f"importing module {name!r} failed: {quote(exc)}") from None
    except SyntaxError as exc:
        where = path_label(exc.filename) if exc.filename else name
        line = f":{exc.lineno}" if exc.lineno else ""
        raise UserError(f"{where}{line}: syntax error: {exc.msg}") from None
    except (Exception, SystemExit) as exc:
        raise UserError(f"importing module {name!r} failed: {quote(exc)}") from None
    return Origin(namespace=namespace, label=name, file_path=None)


@contextlib.contextmanager
def _on_sys_path(directory: str) -> Iterator[None]:
    """Put ``directory`` first on sys.path while importing, so the user's sibling imports work."""
    sys.path.insert(0, directory)
    importlib.invalidate_caches()  # files written moments ago (tests, generated code) must be seen
    try:
        yield
    finally:
        # Remove only our entry: anything the user's code added to sys.path stays.
        try:
            sys.path.remove(directory)
        except ValueError:
            pass
