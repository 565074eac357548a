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
from typing import Dict, List, Tuple

import torch
from torch import nn

from preclint.load.checkpoint_records import CheckpointError, is_torch_zip, mappable

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


def is_safetensors(path: str) -> bool:
    """A safetensors file: 8 bytes of header length, then a JSON header."""
    try:
        with open(path, "rb") as f:
            head = f.read(9)
    except OSError:
        return False
    return len(head) == 9 and head[8:9] == b"{" and struct.unpack("<Q", head[:8])[0] > 1


# the safetensors library's own limit on the header (safetensors/src/tensor.rs, MAX_HEADER_SIZE)
SAFETENSORS_MAX_HEADER = 100_000_000


def read_safetensors(path: str) -> Dict[str, torch.Tensor]:
    """The tensors of a safetensors file, as views of the file mapped into memory (copy-on-write:
    nothing preclint does writes to the file). The header is held to what the safetensors library
    accepts: its length within the file, and tensors that tile the data exactly, each as large as
    its shape and dtype say, so that no tensor reads another's bytes or the header's."""
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise _not_safetensors("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", raw)
        f.seek(0, 2)
        size = f.tell()
        if length > SAFETENSORS_MAX_HEADER or 8 + length > size:
            raise _not_safetensors(f"its header declares {length} bytes, more than "
                                   f"{'the file holds' if 8 + length > size else 'a safetensors header may take'}")
        f.seek(8)
        try:
            header = json.loads(f.read(length))
        except (ValueError, UnicodeDecodeError) as exc:
            raise _not_safetensors(f"its safetensors header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise _not_safetensors("its safetensors header is not a table of tensors")
    header.pop("__metadata__", None)
    start = 8 + length
    entries = [_safetensors_entry(name, info) for name, info in header.items()]
    _tile_the_data(entries, size - start)
    storage = torch.UntypedStorage.from_file(path, shared=False, nbytes=size)
    tensors: Dict[str, torch.Tensor] = {}
    for name, dtype, shape, begin, end in entries:
        itemsize = torch.empty((), dtype=dtype).element_size()
        offset = start + begin
        if offset % itemsize == 0:
            tensors[name] = torch.empty(0, dtype=dtype).set_(storage, offset // itemsize, shape)
        else:  # an unaligned entry (the format does not promise alignment): read as bytes, then viewed
            flat = torch.empty(0, dtype=torch.uint8).set_(storage, offset, [end - begin]).clone()
            tensors[name] = flat.view(dtype).reshape(shape)
    return tensors


def _not_safetensors(reason: str) -> CheckpointError:
    return CheckpointError(f"cannot be read as safetensors: {reason}")


def _safetensors_entry(name: str, info: object) -> Tuple[str, torch.dtype, List[int], int, int]:
    """(name, dtype, shape, begin, end) of one header entry, whose size its shape and dtype fix."""
    if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
        raise _not_safetensors(f"its entry {name!r} is not a tensor (a dtype, a shape and data_offsets)")
    dtype = _SAFETENSORS_DTYPES.get(info["dtype"]) if isinstance(info["dtype"], str) else None
    if dtype is None:
        raise _not_safetensors(f"its entry {name!r} is not a tensor this torch reads ({info['dtype']!r})")
    shape, offsets = info["shape"], info["data_offsets"]
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _not_safetensors(f"its entry {name!r} has the shape {shape!r}, not a list of whole numbers >= 0")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_count(o) for o in offsets):
        raise _not_safetensors(f"its entry {name!r} has the data_offsets {offsets!r}, not two whole numbers >= 0")
    begin, end = offsets
    numel = 1
    for d in shape:
        numel *= d
    needed = numel * torch.empty((), dtype=dtype).element_size()
    if end - begin != needed:
        raise _not_safetensors(f"its entry {name!r} takes {end - begin} bytes where its shape {shape} and dtype "
                               f"{info['dtype']} need {needed}")
    return name, dtype, shape, begin, end


def _is_count(value: object) -> bool:
    """A dimension or an offset: a whole number >= 0 (JSON's 3.0 and true are not)."""
    return type(value) is int and value >= 0


def _tile_the_data(entries: List[Tuple[str, torch.dtype, List[int], int, int]], data_size: int) -> None:
    """The entries, in order of their offsets, cover the data after the header from its first byte
    to its last, without gaps or overlaps (what the safetensors library checks before it reads)."""
    ordered = sorted(entries, key=lambda e: (e[3], e[4]))
    for name, _dtype, _shape, begin, end in ordered:
        if end > data_size:
            raise _not_safetensors(f"its entry {name!r} lies past the end of the file (bytes {begin} to {end} of "
                                   f"the {data_size} after the header)")
    for (before, *_, before_end), (name, _dtype, _shape, begin, _end) in zip(ordered, ordered[1:]):
        if begin < before_end:
            raise _not_safetensors(f"its entries {before!r} and {name!r} overlap (bytes {begin} to {before_end})")
    position = 0
    for name, _dtype, _shape, begin, end in ordered:
        if begin != position:
            raise _not_safetensors(f"its entry {name!r} begins at byte {begin} of the data, after bytes "
                                   f"{position} to {begin} that no tensor holds")
        position = end
    if position != data_size:
        raise _not_safetensors(f"its tensors end at byte {position} of the {data_size} after the header")


def read_checkpoint(path: str):
    """What a weights file holds: a safetensors table, or a ``torch.save`` object loaded with
    ``weights_only=True``, memory-mapped where torch's mapping reads what torch reads without it
    (checkpoint_records.py: records stored uncompressed, each of its storage's size)."""
    if is_safetensors(path):
        return read_safetensors(path)
    if not is_torch_zip(path):  # the legacy (non-zip) format cannot be mapped: read it
        return torch.load(path, map_location="cpu", weights_only=True)
    return torch.load(path, map_location="cpu", weights_only=True, mmap=mappable(path))


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
