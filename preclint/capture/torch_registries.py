"""torch's process-wide registries a model's code may add to and never take back, each as a
(name, read, write) setting of preclint.capture.global_state: the TorchFunctionMode stack (with the
default device, which torch keeps as a mode at its bottom), the TorchDispatchMode stack and its
infra modes (fake, proxy, functional), the global module hooks (``register_module_forward_hook``
and the others of torch.nn.modules.module), and the settings of every compiler config module
(``torch._dynamo.config``, ``torch._inductor.config`` ...).

The stacks are given back by popping and pushing their entries directly, so no mode's ``__exit__``
(the model's code) runs on the way out. A read holds references and shallow copies only; a write
changes only what differs, so a call that changed nothing writes nothing.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Dict, List, Tuple

import torch

Setting = Tuple[str, Callable[[], Any], Callable[[Any], None]]

_C = torch._C


# --------------------------------------------------------------------------------- function modes


def _device_module():
    return sys.modules.get("torch.utils._device")  # imported by torch on the first set_default_device


def _read_function_modes() -> Tuple[Any, ...]:
    stack = tuple(_C._get_function_stack_at(i) for i in range(_C._len_torch_function_stack()))
    device = _device_module()
    context = getattr(getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None), "device_context", None)
    return stack, context, getattr(device, "CURRENT_DEVICE", None) if device is not None else None


def _write_function_modes(saved: Tuple[Any, ...]) -> None:
    stack, context, current = saved
    if _read_function_modes() == saved:
        return
    while _C._len_torch_function_stack():
        _C._pop_torch_function_stack()
    for mode in stack:
        _C._push_on_torch_function_stack(mode)
    holder = getattr(torch, "_GLOBAL_DEVICE_CONTEXT", None)
    if holder is not None:
        holder.device_context = context
    device = _device_module()
    if device is not None:
        device.CURRENT_DEVICE = current


# --------------------------------------------------------------------------------- dispatch modes


def _infra_keys() -> List[Any]:
    keys = getattr(_C, "_TorchDispatchModeKey", None)
    return list(keys.__members__.values()) if keys is not None else []


def _read_dispatch_modes() -> Tuple[Any, ...]:
    infra = tuple(_C._get_dispatch_mode(key) for key in _infra_keys())
    # (the stack's length counts the infra modes, which come first)
    everything = [_C._get_dispatch_stack_at(i) for i in range(_C._len_torch_dispatch_stack())]
    stack = tuple(mode for mode in everything if not any(mode is m for m in infra))
    dispatch = sys.modules.get("torch.utils._python_dispatch")
    return stack, infra, getattr(dispatch, "_is_in_torch_dispatch_mode", None)


def _write_dispatch_modes(saved: Tuple[Any, ...]) -> None:
    stack, infra, flag = saved
    if _read_dispatch_modes() == saved:
        return
    keys = _infra_keys()
    for key in keys:
        if _C._get_dispatch_mode(key) is not None:
            _C._unset_dispatch_mode(key)
    while _C._len_torch_dispatch_stack():
        _C._pop_torch_dispatch_stack(None)
    for mode in stack:
        _C._push_on_torch_dispatch_stack(mode)
    for key, mode in zip(keys, infra):
        if mode is not None:
            _C._set_dispatch_mode(mode)
    dispatch = sys.modules.get("torch.utils._python_dispatch")
    if dispatch is not None and flag is not None:
        dispatch._is_in_torch_dispatch_mode = flag


# ------------------------------------------------------------------------------ global module hooks


def _module_globals() -> Dict[str, Any]:
    from torch.nn.modules import module

    return {name: value for name, value in vars(module).items() if name.startswith("_global_")}


def _read_module_hooks() -> Dict[str, Any]:
    return {name: dict(value) if isinstance(value, dict) else value for name, value in _module_globals().items()}


def _write_module_hooks(saved: Dict[str, Any]) -> None:
    from torch.nn.modules import module

    for name, value in saved.items():
        current = getattr(module, name, None)
        if isinstance(current, dict) and isinstance(value, dict):
            if list(current.items()) != list(value.items()):
                current.clear()  # in place: torch reads the dict it made at import
                current.update(value)
        elif current is not value:
            setattr(module, name, value)


# ------------------------------------------------------------------------------ compiler configs


_scanned: List[Any] = [-1, {}]  # (len(sys.modules), the config modules found) of the last scan


def _config_modules() -> Dict[str, Any]:
    """Every config module torch installed (torch.utils._config_module), by name, loaded now."""
    kind = getattr(sys.modules.get("torch.utils._config_module"), "ConfigModule", None)
    if kind is None:
        return {}
    # (a scan of sys.modules costs about a millisecond: done again only where modules came or went)
    if _scanned[0] != len(sys.modules):
        _scanned[:] = [len(sys.modules), {name: module for name, module in list(sys.modules.items())
                                          if type(module) is not ModuleType and isinstance(module, kind)}]
    return dict(_scanned[1])


def _changed_settings(module: Any) -> Dict[str, Any]:
    """The settings of a config module that are not at their defaults (copies); every setting where
    this torch cannot tell."""
    try:  # (readonly_values: torch keeps the result and recomputes only the settings changed since)
        return module._get_dict(skip_default=True, readonly_values=True)
    except TypeError:
        pass
    try:
        return module._get_dict(skip_default=True)
    except (AttributeError, TypeError):
        return module.get_config_copy()


def _read_configs() -> Dict[str, Dict[str, Any]]:
    """Per config module loaded, its settings away from their defaults (a module first imported
    during the call, left at its defaults, reads as not there)."""
    found = {name: _changed_settings(module) for name, module in _config_modules().items()}
    return {name: values for name, values in found.items() if values}


def _write_configs(saved: Dict[str, Dict[str, Any]]) -> None:
    for name, module in _config_modules().items():
        if name not in saved and not hasattr(module, "_is_default"):
            continue  # first loaded during the call, by a torch that cannot tell its defaults: left as it is
        values = saved.get(name, {})
        now = _changed_settings(module)
        for key in [key for key in now if key not in values]:
            _reset(module, key)  # set by the model's code where it was at its default
        for key, value in values.items():
            if not _same(now.get(key, _MISSING), value):
                setattr(module, key, value)


_MISSING = object()


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - a value whose == raises (a tensor): not the same
        return a is b


def _reset(module: Any, key: str) -> None:
    """One setting of a config module back at its default: what the model's code set is forgotten
    (the entry's ``user_override``, as torch's own ``_make_closure_patcher`` reverts it)."""
    unset = getattr(sys.modules.get("torch.utils._config_module"), "_UNSET_SENTINEL", None)
    entries = getattr(module, "_config", None)
    override = getattr(entries.get(key), "user_override", None) if isinstance(entries, dict) else None
    if unset is None or override is None:
        raise RuntimeError(f"{module.__name__}.{key} cannot be set back to its default in this torch")
    override.set(unset)
    for mark in ("_hash_dirty_var",):
        if hasattr(module, mark):
            getattr(module, mark).set(True)
    if hasattr(module, "_mark_get_dict_dirty"):
        module._mark_get_dict_dirty(key)


def settings() -> List[Setting]:
    return [
        ("torch function modes and default device", _read_function_modes, _write_function_modes),
        ("torch dispatch modes", _read_dispatch_modes, _write_dispatch_modes),
        ("torch.nn.modules.module global hooks", _read_module_hooks, _write_module_hooks),
        ("compiler config modules", _read_configs, _write_configs),
    ]
