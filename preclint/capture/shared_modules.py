"""Module instances a model holds in several places (Ultralytics gives every block the one
``nn.SiLU`` in ``Conv.default_act``): ``named_modules()`` names such an instance once, after its first
owner, so every call of it would be that owner's. A call is named after its call site instead, the
module whose forward made it: ``model.3.act`` for the activation block 3 calls."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch


def shared_module_paths(root: torch.nn.Module) -> Dict[int, Tuple[str, ...]]:
    """id of each module held in more than one place -> all its paths, in ``named_modules`` order."""
    paths: Dict[int, list] = {}
    for path, module in root.named_modules(remove_duplicate=False):
        paths.setdefault(id(module), []).append(path)
    return {key: tuple(found) for key, found in paths.items() if len(found) > 1}


def call_site_path(root: torch.nn.Module, caller: str, module: torch.nn.Module, first: str) -> str:
    """The path of ``module`` as the module at path ``caller`` holds it (the caller's attribute that
    is ``module``); ``first``, its first owner's path, where the caller holds it under no name of its own
    (it reached the module some other way: a global, another module's attribute)."""
    parent = _submodule(root, caller)
    if parent is not None:
        for name, child in parent._modules.items():
            if child is module:
                return f"{caller}.{name}" if caller else name
    return first


def _submodule(root: torch.nn.Module, path: str) -> Optional[torch.nn.Module]:
    try:
        return root.get_submodule(path) if path else root
    except AttributeError:
        return None
