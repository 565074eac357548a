"""Where the probe runs, the precision flags it sets there, and the record of both.

A reader trusts a measured error only as far as the reference it was measured against, so the probe
records the software (torch, CUDA, cuDNN), the GPU and every flag that changes how float32, float16
and bfloat16 are computed, as they stood before the probe touched them.

TF32 has two APIs in torch (measure/backends.py, which sets it): reading a legacy flag after the
new API set a value raises, so every flag is read defensively.
"""
from __future__ import annotations

import platform
import re
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, Optional

import torch

from preclint.core.errors import UserError
from preclint.measure.backends import new_tf32_api, tf32


def select_device(choice: str) -> torch.device:
    """The device of ``--probe CHOICE`` (a ProbeOptions.device, checked there); emulation happens
    exactly when it is the CPU."""
    if choice == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if choice == "cuda" and not available:
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support"
        raise UserError(
            f"--probe cuda: torch {torch.__version__} ({build}) sees no CUDA device; "
            "run with --probe cpu to emulate the precisions on the CPU"
        )
    if available:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _read(getter: Callable[[], Any]) -> Any:
    try:
        value = getter()
    except Exception as exc:  # a legacy flag after the new API was used raises; say so instead
        return f"unreadable ({type(exc).__name__})"
    return value if isinstance(value, (bool, int, float, str)) or value is None else str(value)


def precision_flags() -> Dict[str, Any]:
    """Every flag that changes float32/float16/bfloat16 arithmetic, as it stands now."""
    b = torch.backends
    getters: Dict[str, Callable[[], Any]] = {
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision,
        "torch.backends.cuda.matmul.allow_tf32": lambda: b.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": lambda: b.cudnn.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction":
            lambda: b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction":
            lambda: b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "torch.backends.cudnn.enabled": lambda: b.cudnn.enabled,
        "torch.backends.cudnn.benchmark": lambda: b.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": lambda: b.cudnn.deterministic,
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled,
        "torch.backends.cuda.flash_sdp_enabled()": lambda: b.cuda.flash_sdp_enabled(),
        "torch.backends.cuda.mem_efficient_sdp_enabled()": lambda: b.cuda.mem_efficient_sdp_enabled(),
        "torch.backends.cuda.math_sdp_enabled()": lambda: b.cuda.math_sdp_enabled(),
    }
    if new_tf32_api():
        getters["torch.backends.cuda.matmul.fp32_precision"] = lambda: b.cuda.matmul.fp32_precision
        getters["torch.backends.cudnn.conv.fp32_precision"] = lambda: b.cudnn.conv.fp32_precision
        if hasattr(getattr(b.cudnn, "rnn", None), "fp32_precision"):
            getters["torch.backends.cudnn.rnn.fp32_precision"] = lambda: b.cudnn.rnn.fp32_precision
        if hasattr(b, "fp32_precision"):
            getters["torch.backends.fp32_precision"] = lambda: b.fp32_precision
    return {key: _read(getter) for key, getter in sorted(getters.items())}


def software() -> Dict[str, Any]:
    """The versions of what computes the numbers: torch, Python, CUDA, cuDNN, torchvision."""
    env: Dict[str, Any] = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cuda": torch.version.cuda,
        "cudnn": _read(torch.backends.cudnn.version) if torch.backends.cudnn.is_available() else None,
    }
    try:
        import torchvision

        env["torchvision"] = torchvision.__version__
    except ImportError:
        pass
    return env


def check_environment() -> Dict[str, Any]:
    """The record of a check without a probe: the predictions ran on this CPU, with these flags."""
    return {**software(), "cpu": platform.processor() or platform.machine(), "flags": precision_flags()}


def environment(device: torch.device, emulated: bool) -> Dict[str, Any]:
    """The record a reader needs to trust the reference: software, hardware and flags."""
    env: Dict[str, Any] = {"device": str(device), "emulated": emulated, **software()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["gpu"] = props.name
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    else:
        env["cpu"] = platform.processor() or platform.machine()
        env["threads"] = torch.get_num_threads()
    env["reference"] = {"dtype": "float64", "device": str(device)}
    if device.type == "cuda":
        env["reference"]["tf32"] = False  # for any part the model computes below float64
    env["flags"] = precision_flags()
    return env


def synchronize(device: Optional[torch.device]) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


# What torch says when one op gets tensors of two devices (a model that makes a CPU tensor in its
# forward, run on a GPU), in its several wordings.
_DEVICE_MISMATCH = re.compile(r"same device|found at least two devices|(is|are) on (cpu|cuda|meta)|expected .*device|"
                              r"cuda\.\w*Tensor\) and .* should be the same|device type .* but got|"
                              r"with arguments from the '\w+' backend", re.IGNORECASE)


def device_mismatch(exc: BaseException) -> Optional[str]:
    """The line torch gave where ``exc`` (or what caused it) is one op getting tensors of two
    devices, or an op with no kernel on the device (an int8 quantized Linear on a GPU); None for any
    other failure."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        if isinstance(exc, (RuntimeError, ValueError, TypeError, NotImplementedError)) and _DEVICE_MISMATCH.search(text):
            return text
        exc = exc.__cause__ or exc.__context__
    return None


def is_out_of_memory(exc: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom is not None and isinstance(exc, oom):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text.lower() or "DefaultCPUAllocator: can't allocate" in text)


@contextmanager
def tf32_on_gpu(device, enabled: bool) -> Iterator[None]:
    """TF32 on or off for the stage, on a GPU (the CPU has no TF32)."""

    if device.type != "cuda":
        yield
        return
    with tf32(enabled):
        yield


def release(device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
