"""The backend switches a precision mode sets: TF32 for cuDNN convolutions and cuBLAS matmuls.

TF32 has two APIs in torch: the legacy booleans (``torch.backends.cuda.matmul.allow_tf32``,
``torch.backends.cudnn.allow_tf32``) and, since torch 2.9, ``fp32_precision`` strings per backend
and op. Reading a legacy flag after the new API set a value raises, so the switch sets and restores
flags through the new API wherever it exists.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch


def new_tf32_api() -> bool:
    """Whether this torch has the ``fp32_precision`` settings (torch 2.9 and later)."""
    matmul = getattr(torch.backends.cuda, "matmul", None)
    conv = getattr(torch.backends.cudnn, "conv", None)
    return hasattr(matmul, "fp32_precision") and hasattr(conv, "fp32_precision")


# The op-level settings the switch changes: (object, attribute) of the new API.
def _new_api_targets():
    targets = [(torch.backends.cuda.matmul, "fp32_precision"), (torch.backends.cudnn.conv, "fp32_precision")]
    rnn = getattr(torch.backends.cudnn, "rnn", None)
    if hasattr(rnn, "fp32_precision"):
        targets.append((rnn, "fp32_precision"))
    return targets


@contextlib.contextmanager
def tf32(enabled: bool) -> Iterator[None]:
    """TF32 on (or off) for cuDNN convolutions and cuBLAS matmuls, restored on exit."""
    if new_tf32_api():
        targets = _new_api_targets()
        saved = [getattr(obj, attr) for obj, attr in targets]
        try:
            for obj, attr in targets:
                setattr(obj, attr, "tf32" if enabled else "ieee")
            yield
        finally:
            for (obj, attr), value in zip(targets, saved):
                setattr(obj, attr, value)
        return
    saved_matmul = torch.backends.cuda.matmul.allow_tf32
    saved_cudnn = torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = saved_matmul
        torch.backends.cudnn.allow_tf32 = saved_cudnn
