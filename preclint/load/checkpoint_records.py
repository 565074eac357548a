"""The records of a ``torch.save`` checkpoint, checked before torch reads them: mapped, read, or refused.

``torch.load(mmap=True)`` maps the file and takes each tensor storage at its record's offset, as many
bytes as the pickle declares. That is right for the records torch.save writes (stored, uncompressed, of
their storage's size) and silently wrong otherwise: a record that a re-zipping tool deflated would be
read as its compressed bytes, one shorter than its storage as the bytes after it. Read without mmap,
torch decompresses each record into memory, as large as the zip's directory declares, and checks its
size: right, but a zip bomb's few kilobytes can declare more than the machine holds.

So the zip's directory and local headers are read first (nothing is decompressed but the pickle, whose
storages are collected on the meta device by torch's own weights-only unpickler), and the file is

- memory-mapped where every storage is a stored record of the storage's size;
- read into memory (torch decompresses) where a storage's record is compressed and the file's
  storages fit in the memory there is;
- refused, in one line, where a record lies past the end of the file, overlaps another, declares
  more than its compressed bytes can inflate to, is missing or differs in size from its storage
  (torch refuses those too, after reading them), or would not fit in memory.
"""
from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from preclint.load.available_memory import available_memory, format_bytes

ZIP_MAGIC = b"PK\x03\x04"  # a local header's signature, which torch.load looks for at a checkpoint's start
# Deflate's largest expansion: a 258-byte match coded in as few as 2 bits; the slack covers a stream's
# final block and a few literals
DEFLATE_MAX_RATIO = 1032
DEFLATE_SLACK = 1024
_LOCAL_HEADER = struct.Struct("<4s5H3L2H")  # signature ... file name length, extra field length


class CheckpointError(Exception):
    """The file is not a weights file preclint reads; the message says why (checkpoints.py raises it too)."""


@dataclass(frozen=True)
class Record:
    name: str
    method: int  # zipfile.ZIP_STORED, ZIP_DEFLATED, ...
    size: int  # declared uncompressed
    stored_size: int  # bytes it takes in the file
    start: int  # its local header
    data_start: int


def is_torch_zip(path: str) -> bool:
    """Whether torch.load reads ``path`` as a zip checkpoint (it looks at the first four bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == ZIP_MAGIC
    except OSError:
        return False


def mappable(path: str) -> bool:
    """Whether ``torch.load(path, mmap=True)`` reads the zip checkpoint at ``path`` as torch reads it
    without mmap; False: read it without mmap (it fits in memory). Raises CheckpointError for a file
    that must not be read at all."""
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
        raise CheckpointError(f"its zip directory cannot be read ({exc})") from None
    with archive:
        with open(path, "rb") as f:
            records = _records(archive, f)
        infos = archive.infolist()
        if not infos:
            raise CheckpointError("it is a zip file without records, not a torch.save checkpoint")
        # torch's reader takes the archive's name from its first record, and finds the others under it
        prefix = infos[0].filename.split("/", 1)[0] + "/"
        storage_prefix = prefix + "data/"
        always_read = [r for r in records.values() if not r.name.startswith(storage_prefix)]
        _must_fit(sum(r.size for r in always_read if r.method != zipfile.ZIP_STORED), "its pickle and version records")
        declared = _declared_storages(archive, prefix + "data.pkl") if prefix + "data.pkl" in records else None
    if declared is None:  # not a pickle torch's weights-only unpickler reads: torch.load says why
        storages = [r for r in records.values() if r.name.startswith(storage_prefix)]
        compressed = [r for r in storages if r.method != zipfile.ZIP_STORED]
        _must_fit(sum(r.size for r in storages) if compressed else 0, "its compressed records")
        return not compressed
    needed = 0
    compressed = False
    for key, nbytes in declared.items():
        record = records.get(storage_prefix + key)
        if record is None:
            raise CheckpointError(f"its pickle names a storage {key!r} that has no record {storage_prefix}{key}")
        if record.size != nbytes:
            raise CheckpointError(f"its record {record.name} holds {record.size} bytes where its tensor storage "
                                  f"declares {nbytes}")
        compressed = compressed or record.method != zipfile.ZIP_STORED
        needed += nbytes
    if compressed:
        _must_fit(needed, "its tensors, whose records are compressed,")
    return not compressed


def _records(archive: zipfile.ZipFile, f) -> Dict[str, Record]:
    """The archive's records as its directory and local headers declare them, each checked against
    the file's size and against the others."""
    f.seek(0, 2)
    file_size = f.tell()
    records: Dict[str, Record] = {}
    for info in archive.infolist():
        f.seek(info.header_offset)
        header = f.read(_LOCAL_HEADER.size)
        if len(header) < _LOCAL_HEADER.size or header[:4] != ZIP_MAGIC:
            raise CheckpointError(f"its record {info.filename} has no local header at byte {info.header_offset}, "
                                  "where the zip's directory puts it")
        name_length, extra_length = _LOCAL_HEADER.unpack(header)[-2:]
        data_start = info.header_offset + _LOCAL_HEADER.size + name_length + extra_length
        record = Record(info.filename, info.compress_type, info.file_size, info.compress_size, info.header_offset,
                        data_start)
        if data_start + record.stored_size > file_size:
            raise CheckpointError(f"its record {record.name} declares {record.stored_size} bytes at byte {data_start}, "
                                  f"past the end of the file ({file_size} bytes)")
        if record.method == zipfile.ZIP_STORED and record.size != record.stored_size:
            raise CheckpointError(f"its uncompressed record {record.name} declares {record.size} bytes but takes "
                                  f"{record.stored_size} in the file")
        if record.method == zipfile.ZIP_DEFLATED and \
                record.size > DEFLATE_MAX_RATIO * record.stored_size + DEFLATE_SLACK:
            raise CheckpointError(f"its record {record.name} declares {record.size} bytes, more than its "
                                  f"{record.stored_size} compressed bytes can inflate to")
        if record.name in records:
            raise CheckpointError(f"it holds two records named {record.name}")
        records[record.name] = record
    _no_overlap(list(records.values()))
    return records


def _no_overlap(records: List[Record]) -> None:
    """Records share no bytes (a zip bomb's way to declare more than the file holds is to point
    many records at the same compressed bytes)."""
    ordered = sorted(records, key=lambda r: r.start)
    for before, after in zip(ordered, ordered[1:]):
        if after.start < before.data_start + before.stored_size:
            raise CheckpointError(f"its records {before.name} and {after.name} overlap in the file")


def _declared_storages(archive: zipfile.ZipFile, pickle_name: str) -> Optional[Dict[str, int]]:
    """The storages the checkpoint's pickle declares (key -> bytes), as torch.load's weights-only
    unpickler finds them, on the meta device (nothing else is read); None where that unpickler is
    not there (another torch) or refuses the pickle (torch.load then says why)."""
    try:
        from torch._weights_only_unpickler import Unpickler
        element_size = torch._utils._element_size
    except (ImportError, AttributeError):
        return None
    declared: Dict[str, int] = {}

    def persistent_load(saved_id):
        storage_type, key, _location, numel = saved_id[1:]
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        nbytes = int(numel) * element_size(dtype)
        declared.setdefault(str(key), nbytes)  # torch.load takes a storage named twice at its first size
        return torch.storage.TypedStorage(wrap_storage=torch.UntypedStorage(declared[str(key)], device="meta"),
                                          dtype=dtype, _internal=True)

    try:
        unpickler = Unpickler(io.BytesIO(archive.read(pickle_name)), encoding="utf-8")
        unpickler.persistent_load = persistent_load
        unpickler.load()
    except Exception:  # noqa: BLE001 - whatever it is, torch.load meets it again and says it in its words
        return None
    return declared


def _must_fit(nbytes: int, what: str) -> None:
    available = available_memory() if nbytes else None
    if available is not None and nbytes > available:
        raise CheckpointError(f"{what} would take {format_bytes(nbytes)} of memory to decompress, more than the "
                              f"{format_bytes(available)} available (a zip bomb, or a checkpoint re-zipped with "
                              "compression: torch.save writes records uncompressed, which preclint maps instead)")
