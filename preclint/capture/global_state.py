"""The process-wide state that running a model's code may change, saved and given back.

Checking a model runs code preclint did not write (building the model, its forward, the probe's
runs), and preclint sets some of this state itself (seeds, TF32 for a mode, grad mode). Called from
a notebook or a test suite, a check must leave the process as it found it, whatever the model did:
``preserved()`` saves every setting below and restores it on the way out, exception or not.

Saved: the working directory, ``sys.path``, the environment variables and the recursion limit
(process_state.py); the random generators (torch's CPU and, where initialised, CUDA generators;
Python's ``random``; numpy's global one where numpy is loaded), the default dtype, the float32
precision of every backend through the getters it is read with (fp32_precision.py: the legacy
``allow_tf32`` flags and ``float32_matmul_precision`` and the ``fp32_precision`` settings of torch
>= 2.9 alike), the reduced-precision reductions, cuDNN's switches and the scaled-dot-product-attention
backends, autocast (per device type: on or off, dtype, its cache and the nesting of its regions),
grad and anomaly mode, the deterministic-algorithms flags, the number of threads; the
TorchFunctionMode stack with the default device, the TorchDispatchMode stack, the global module
hooks and every compiler config module's settings (torch_registries.py). Not restorable: the
inter-op thread count once set (torch takes it once per process; a warning says so) and an
inference-mode region left open (a C++ guard with no setter). A setting that cannot be put back is
named in a RuntimeWarning, and the others are still put back. Only what reads otherwise than before
is written (some setters do more than set: ``torch.use_deterministic_algorithms`` may set an
environment variable), the interpreter's paths first (torch's setters may import) and the
environment last.
"""
from __future__ import annotations

import contextlib
import random
import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch

from preclint.capture import fp32_precision, process_state, torch_registries

Setting = Tuple[str, Callable[[], Any], Callable[[Any], None]]

# (the devices autocast keeps a state for; those this build does not know are skipped)
AUTOCAST_DEVICES = ("cpu", "cuda", "xpu", "mps", "hpu", "xla")


def _attribute(path: str) -> Setting:
    """A setting that is an attribute, such as ``torch.backends.cudnn.benchmark``."""
    owner_path, _, name = path.rpartition(".")

    def owner():
        obj: Any = torch
        for part in owner_path.split(".")[1:]:
            obj = getattr(obj, part)
        return obj

    return path, lambda: getattr(owner(), name), lambda value: setattr(owner(), name, value)


def _sdp(name: str) -> Setting:
    cuda = torch.backends.cuda
    return (f"torch.backends.cuda.{name}_sdp_enabled()", getattr(cuda, f"{name}_sdp_enabled"),
            getattr(cuda, f"enable_{name}_sdp"))


def _deterministic() -> Setting:
    def read():
        return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()

    def write(value):
        torch.use_deterministic_algorithms(value[0], warn_only=value[1])

    return "torch.use_deterministic_algorithms()", read, write


def _anomaly() -> Setting:
    def read():
        return torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()

    return "torch.set_anomaly_enabled()", read, lambda value: torch.set_anomaly_enabled(value[0], value[1])


def _autocast(device: str) -> List[Setting]:
    return [(f"torch.is_autocast_enabled({device!r})", lambda: torch.is_autocast_enabled(device),
             lambda value: torch.set_autocast_enabled(device, value)),
            (f"torch.get_autocast_dtype({device!r})", lambda: torch.get_autocast_dtype(device),
             lambda value: torch.set_autocast_dtype(device, value))]


def _autocast_nesting() -> Setting:
    """How many autocast regions are open: a region the model enters and never leaves is closed,
    and its cast cache cleared as leaving the last one clears it."""

    def read():
        level = torch.autocast_increment_nesting()
        torch.autocast_decrement_nesting()
        return level - 1

    def write(level):
        current = read()
        while current > level:
            current = torch.autocast_decrement_nesting()
            if current == 0:
                torch.clear_autocast_cache()
        while current < level:
            current = torch.autocast_increment_nesting()

    return "autocast nesting", read, write


def _random_generators() -> List[Setting]:
    settings: List[Setting] = [("torch.get_rng_state()", torch.get_rng_state, torch.set_rng_state),
                               ("random.getstate()", random.getstate, random.setstate)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        settings.append(("torch.cuda.get_rng_state_all()", torch.cuda.get_rng_state_all, torch.cuda.set_rng_state_all))
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        settings.append(("numpy.random.get_state()", numpy.random.get_state, numpy.random.set_state))
    return settings


def settings() -> List[Setting]:
    """Every setting ``preserved`` restores, in the order it restores them."""
    found = process_state.settings_first() + _random_generators() + [
        ("torch.get_default_dtype()", torch.get_default_dtype, torch.set_default_dtype),
        ("float32 precision (TF32)", fp32_precision.read, fp32_precision.write),
        _attribute("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction"),
        _attribute("torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction"),
        _attribute("torch.backends.cuda.matmul.allow_fp16_accumulation"),
        _attribute("torch.backends.cudnn.enabled"), _attribute("torch.backends.cudnn.benchmark"),
        _attribute("torch.backends.cudnn.deterministic"), _attribute("torch.backends.mkldnn.enabled"),
        _sdp("flash"), _sdp("mem_efficient"), _sdp("math"), _sdp("cudnn"),
        _autocast_nesting(),
        *[s for device in AUTOCAST_DEVICES for s in _autocast(device)],
        ("torch.is_autocast_cache_enabled()", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
        ("torch.is_grad_enabled()", torch.is_grad_enabled, torch.set_grad_enabled),
        _anomaly(),
        _deterministic(),
        ("torch.get_num_threads()", torch.get_num_threads, torch.set_num_threads),
        _interop_threads(),
        *torch_registries.settings(),
        *process_state.settings_last(),
    ]
    return found


def _interop_threads() -> Setting:
    def write(count: int) -> None:
        if torch.get_num_interop_threads() != count:  # torch refuses a second setting: the warning says so
            torch.set_num_interop_threads(count)

    return "torch.get_num_interop_threads()", torch.get_num_interop_threads, write


def snapshot() -> Dict[str, Any]:
    """Each setting this torch can read, by name, as it stands now."""
    values: Dict[str, Any] = {}
    for name, read, _ in settings():
        for value in _read(read):
            values[name] = value
    return values


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except (ValueError, RuntimeError):  # numpy arrays inside a state
        import numpy

        return bool(numpy.array_equal(a, b))


def changed(before: Dict[str, Any], after: Dict[str, Any]) -> List[str]:
    """The names of the settings whose values differ between two snapshots."""
    return sorted(name for name in before.keys() | after.keys()
                  if name not in before or name not in after or not _same(before[name], after[name]))


@contextlib.contextmanager
def preserved() -> Iterator[None]:
    """Run the body, then put every setting back as it was before it (see the module's docstring)."""
    saved = [(name, read, write, value) for name, read, write in settings() for value in _read(read)]
    try:
        yield
    finally:
        failed = []
        for name, read, write, value in saved:
            try:
                if any(_same(now, value) for now in _read(read)):
                    continue  # as it was: not written (some setters do more than set, see settings_last)
                write(value)
            except Exception as exc:  # noqa: BLE001 - one setting that cannot go back must not keep the others
                failed.append(f"{name} ({' '.join(str(exc).split()) or type(exc).__name__})")
        if failed:
            warnings.warn("preclint could not give back what the model's code changed: " + "; ".join(failed),
                          RuntimeWarning, stacklevel=3)


def _read(read: Callable[[], Any]) -> List[Any]:
    try:
        return [read()]
    except Exception:  # noqa: BLE001 - a device type or flag this build lacks, a directory removed
        return []
