"""Which source files are whose: the user's model code, a library's (torchvision, transformers),
torch's own, Python's or preclint's; and the frames of the model's code that made an op, read from
the live stack (as FX traces, or as a recorded run runs)."""
from __future__ import annotations

import os
import sys
import sysconfig
from typing import Dict, Tuple

import torch

from preclint.core.findings import Location

_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_PRECLINT_DIR = os.path.dirname(os.path.abspath(sys.modules[__name__.split(".", 1)[0]].__file__)) + os.sep  # the package, all stages
_STDLIB_DIRS = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("stdlib", "platstdlib")})


def _in_library(path: str) -> bool:
    return f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path


def _is_model_code(path: str) -> bool:
    """Whether a frame's file is code of the model (the user's or a library's such as torchvision or
    transformers), not torch's own machinery, Python's standard library or generated code."""
    if path.startswith("<"):  # <frozen runpy>, <string>, <eval_with_key.3>: no file to point at
        return False
    path = os.path.abspath(path)
    if path.startswith(_TORCH_DIR) or path.startswith(_PRECLINT_DIR):
        return False
    return _in_library(path) or not path.startswith(_STDLIB_DIRS)


def is_internal_file(path: str) -> bool:
    """Whether a source file belongs to torch, preclint or an installed library rather than to the user."""
    path = os.path.abspath(path)
    torchvision = sys.modules.get("torchvision")
    if torchvision is not None and path.startswith(os.path.dirname(os.path.abspath(torchvision.__file__)) + os.sep):
        return True
    return not _is_model_code(path) or _in_library(path)


# A frame's file, classified once: (preclint's own, the model's code). Every recorded op of every
# pass walks the stack (30 frames deep in a transformer); normalising each frame's path again made
# this walk a third of the probe's time on a Llama.
_FILE_CLASSES: Dict[str, Tuple[bool, bool]] = {}


def _file_class(path: str) -> Tuple[bool, bool]:
    found = _FILE_CLASSES.get(path)
    if found is None:
        found = _FILE_CLASSES[path] = (os.path.abspath(path).startswith(_PRECLINT_DIR), _is_model_code(path))
    return found


def model_frames_on_stack() -> Tuple[Location, ...]:
    """The frames of the model's code that led to the running op, innermost first (as above), read
    from the live stack: past preclint's own frames (the hook that calls this), up to the next one
    (capture, which called the model)."""
    frame = sys._getframe(1)
    while frame is not None and _file_class(frame.f_code.co_filename)[0]:
        frame = frame.f_back
    found = []
    while frame is not None:
        path = frame.f_code.co_filename
        own, model = _file_class(path)
        if own:
            break
        if model:
            found.append(Location(path, frame.f_lineno, 1))
        frame = frame.f_back
    return tuple(found)
