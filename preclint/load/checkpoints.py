"""Weights files read without a copy: safetensors and ``torch.save`` state dicts, memory-mapped.

A large model's weights are read where they lie: the tensors of a safetensors file are views of the
file mapped into memory (pages the kernel reads as they are used, and may drop again), and a
``torch.save`` checkpoint is loaded with ``mmap=True`` and ``weights_only=True`` (no code in the file
ever runs; a safetensors file holds no code at all). A model built on the meta device (no memory for
its weights) takes the file's tensors as its own, so the weights exist once on the host, in the file's
pages; a model built with its weights takes the values into them.
"""
from __future__ import annotations

import json
import struct
from typing import Dict, List

import torch
from torch import nn

# safetensors dtype names (https://github.com/huggingface/safetensors, the format's header)
_SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
for _name, _attr in (("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2"), ("U16", "uint16"),
                     ("U32", "uint32"), ("U64", "uint64")):
    if hasattr(torch, _attr):
        _SAFETENSORS_DTYPES[_name] = getattr(torch, _attr)


class CheckpointError(Exception):
    """The file is not a weights file preclint reads; the message says why."""


def is_safetensors(path: str) -> bool:
    """A safetensors file: 8 bytes of header length, then a JSON header."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] > 1


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file, as views of the file mapped into memory (copy-on-write:
    nothing preclint does writes to the file)."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise CheckpointError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"its safetensors header is not JSON ({exc})") from None
        f.seek(0, 2)
        size = f.tell()
    if not isinstance(header, dict):
        raise CheckpointError("its safetensors header is not a table of tensors")
    header.pop("__metadata__", None)
    storage = torch.UntypedStorage.from_file(path, shared=False, nbytes=size)
    start = 8 + length
    tensors: Dict[str, torch.Tensor] = {}
    for name, info in header.items():
        try:
            dtype = _SAFETENSORS_DTYPES[info["dtype"]]
            shape = [int(d) for d in info["shape"]]
            begin, end = (int(o) for o in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"its entry {name!r} is not a tensor this torch reads "
                                  f"({info.get('dtype') if isinstance(info, dict) else info!r})") from None
        itemsize = torch.empty((), dtype=dtype).element_size()
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * itemsize or start + end > size or begin < 0:
            raise CheckpointError(f"its entry {name!r} does not fit the file")
        offset = start + begin
        if offset % itemsize == 0:
            tensors[name] = torch.empty(0, dtype=dtype).set_(storage, offset // itemsize, shape)
        else:  # an unaligned entry (the format does not promise alignment): read as bytes, then viewed
            flat = torch.empty(0, dtype=torch.uint8).set_(storage, offset, [end - begin]).clone()
            tensors[name] = flat.view(dtype).reshape(shape)
    return tensors


def read_checkpoint(path: str):
    """What a weights file holds: a safetensors table, or a ``torch.save`` object loaded with
    ``weights_only=True`` (memory-mapped where the file's format allows)."""
    if is_safetensors(path):
        return read_safetensors(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError as exc:
        if "mmap" not in str(exc):  # the legacy (non-zip) format cannot be mapped: read it
            raise
    return torch.load(path, map_location="cpu", weights_only=True)


def meta_tensors(module: nn.Module) -> List[str]:
    """Names of the parameters and buffers a module holds on the meta device (no values)."""
    named = list(module.named_parameters(remove_duplicate=False)) + list(module.named_buffers(remove_duplicate=False))
    return [name for name, t in named if t is not None and t.is_meta]


def assign_state_dict(module: nn.Module, state_dict: Dict[str, torch.Tensor]) -> None:
    """Load ``state_dict`` into a module built on the meta device: its tensors become the module's
    own (converted only where the module declares another dtype), no second copy is made."""
    expected = module.state_dict()
    converted = {}
    for key, value in state_dict.items():
        target = expected.get(key)
        if isinstance(value, torch.Tensor) and isinstance(target, torch.Tensor) and value.dtype != target.dtype \
                and value.is_floating_point() and target.is_floating_point():
            value = value.to(target.dtype)
        converted[key] = value
    module.load_state_dict(converted, strict=True, assign=True)
