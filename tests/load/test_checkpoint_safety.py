"""`preclint check model.py --weights FILE` reads a weights file as torch (or safetensors) reads it,
or refuses it in one line: a re-zipped checkpoint is not mapped as its compressed bytes, a zip bomb
or a record that lies about its size never reaches memory, a safetensors header that lies is refused."""
from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap
import zipfile
import zlib
from pathlib import Path

import pytest
import torch

from preclint.cli import main
from tests.paths import ROOT


MODEL = """
    import torch
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(16, 32)
            self.fc2 = nn.Linear(32, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    example_inputs = (torch.randn(2, 16),)
"""


@pytest.fixture
def model(tmp_path):
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL))
    torch.manual_seed(0)
    state = {"fc1.weight": torch.randn(32, 16) * 0.2, "fc1.bias": torch.randn(32) * 0.1,
             "fc2.weight": torch.randn(4, 32) * 0.2, "fc2.bias": torch.randn(4) * 0.1}
    torch.save(state, tmp_path / "weights.pt")
    return tmp_path


def check(capsys, where: Path, weights: str):
    code = main(["check", str(where / "model.py"), "--weights", str(where / weights), "--output-format", "concise"])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------------ writing zips


def records_of(path: Path):
    with zipfile.ZipFile(path) as archive:
        return [(info.filename, archive.read(info.filename)) for info in archive.infolist()]


def rezip(source: Path, target: Path, method_for) -> None:
    """``source`` written again by zipfile, each record compressed as ``method_for(name)`` says."""
    with zipfile.ZipFile(target, "w") as out:
        for name, data in records_of(source):
            out.writestr(name, data, compress_type=method_for(name))


def write_zip(path: Path, records, points_at=None) -> None:
    """A zip written byte by byte, its sizes as declared: ``records`` are (name, bytes in the file,
    method, declared uncompressed size, crc); ``points_at`` maps a name to the name of the record
    whose local header its directory entry points at."""
    out, directory, offsets = bytearray(), bytearray(), {}
    for name, data, method, size, crc in records:
        encoded = name.encode()
        offsets[name] = len(out)
        out += struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, method, 0, 0x21, crc, len(data), size, len(encoded),
                           0) + encoded + data
    for name, data, method, size, crc in records:
        offset = offsets[(points_at or {}).get(name, name)]
        directory += struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, method, 0, 0x21, crc, len(data), size,
                                 len(name.encode()), 0, 0, 0, 0, 0, offset) + name.encode()
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, len(records), len(records), len(directory), len(out), 0)
    path.write_bytes(bytes(out + directory + end))


def stored(name, data):
    return name, data, zipfile.ZIP_STORED, len(data), zlib.crc32(data)


def deflated_zeros(mib: int):
    """A raw deflate stream of ``mib`` MiB of zeros, about 1 KiB a MiB, and its crc."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = compressor.compress(bytes(1 << 20)) + compressor.flush(zlib.Z_FULL_FLUSH)  # each block the same
    crc, zeros = 0, bytes(1 << 20)
    for _ in range(mib):
        crc = zlib.crc32(zeros, crc)
    return block * mib + compressor.flush(), mib << 20, crc


def deflated(data: bytes) -> bytes:
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    return compressor.compress(data) + compressor.flush()


# ------------------------------------------------------------------------------ read as torch reads


REZIPPED = {
    "every record deflated": lambda name: zipfile.ZIP_DEFLATED,
    "one storage deflated": lambda name: zipfile.ZIP_DEFLATED if name.endswith("/data/2") else zipfile.ZIP_STORED,
    "only the pickle deflated": lambda name: zipfile.ZIP_DEFLATED if name.endswith("data.pkl") else zipfile.ZIP_STORED,
    "stored, unaligned": lambda name: zipfile.ZIP_STORED,
}


@pytest.mark.slow
@pytest.mark.parametrize("how", list(REZIPPED))
def test_a_re_zipped_checkpoint_reads_as_the_original(model, capsys, how):
    rezip(model / "weights.pt", model / "rezipped.pt", REZIPPED[how])
    for original, again in zip(torch.load(model / "weights.pt", weights_only=True).values(),
                               torch.load(model / "rezipped.pt", weights_only=True).values()):
        assert torch.equal(original, again)  # torch itself reads the same weights from both
    expected = check(capsys, model, "weights.pt")
    assert expected[0] == 0 and expected[2] == "", expected
    assert check(capsys, model, "rezipped.pt") == expected  # not the compressed bytes read as weights


def test_a_zip_bomb_in_place_of_a_storage_is_refused_before_it_is_inflated(model, capsys):
    # 256 MiB of zeros, deflated to 260 KiB, where the model's 2 KiB fc1.weight was
    bomb = deflated_zeros(256)
    write_zip(model / "bomb.pt", [(name, bomb[0], zipfile.ZIP_DEFLATED, bomb[1], bomb[2]) if name.endswith("/data/0")
                                  else stored(name, data) for name, data in records_of(model / "weights.pt")])
    code, out, err = check(capsys, model, "bomb.pt")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err == (f"preclint: error: {model / 'bomb.pt'}: its record weights/data/0 holds 268435456 bytes where "
                   "its tensor storage declares 2048\n")


def _lying(records, name_ends, replace):
    return [replace(name, data) if name.endswith(name_ends) else stored(name, data) for name, data in records]


def test_records_that_lie_about_their_size_are_refused_in_one_line(model, capsys):
    records = records_of(model / "weights.pt")
    # declares 3 GiB from the 1.9 KiB its deflated bytes are
    write_zip(model / "ratio.pt", _lying(records, "/data/0", lambda name, data: (
        name, deflated(data), zipfile.ZIP_DEFLATED, 3 << 30, zlib.crc32(data))))
    # a stored record declared larger than the bytes left in the file
    write_zip(model / "past_end.pt", [stored(name, data) for name, data in records])
    raw = bytearray((model / "past_end.pt").read_bytes())
    entry = raw.rfind(b"PK\x01\x02", 0, raw.rfind(b"weights/data/3"))
    struct.pack_into("<2L", raw, entry + 20, 1 << 20, 1 << 20)  # its directory entry: 1 MiB stored
    (model / "past_end.pt").write_bytes(bytes(raw))
    # shorter than its storage: torch without mmap refuses it, with mmap it read the bytes after it
    write_zip(model / "short.pt", _lying(records, "/data/0", lambda name, data: stored(name, data[:64])))
    # two directory entries on one record's bytes: fc1.bias would be read from fc1.weight's
    write_zip(model / "overlap.pt", [stored(n, d) for n, d in records], points_at={"weights/data/1": "weights/data/0"})
    expected = {
        "ratio.pt": "its record weights/data/0 declares 3221225472 bytes, more than its",
        "past_end.pt": "its record weights/data/3 declares 1048576 bytes at byte",
        "short.pt": "its record weights/data/0 holds 64 bytes where its tensor storage declares 2048",
        "overlap.pt": "its records weights/data/0 and weights/data/1 overlap in the file",
    }
    for name, needle in expected.items():
        code, out, err = check(capsys, model, name)
        assert (code, out) == (2, "") and err.count("\n") == 1, (name, err)
        assert err.startswith(f"preclint: error: {model / name}: ") and needle in err, (name, err)


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="an address-space limit (ulimit -v) as on Linux")
def test_a_zip_bomb_larger_than_memory_is_refused_in_one_line(tmp_path):
    # four 1 GiB storages of zeros, deflated to 1 MiB each, under an address-space limit 2 GiB above
    # what the process starts with: torch.load would decompress 4 GiB into memory
    with torch.serialization.skip_data():  # the pickle of four 1 GiB tensors, without their bytes
        torch.save({f"w{i}": torch.empty(2 ** 28) for i in range(4)}, tmp_path / "declared.pt")
    bomb = deflated_zeros(1024)
    with zipfile.ZipFile(tmp_path / "declared.pt") as declared:
        write_zip(tmp_path / "bomb.pt", [(info.filename, *bomb[:1], zipfile.ZIP_DEFLATED, *bomb[1:])
                                         if info.filename.startswith("declared/data/")
                                         else stored(info.filename, declared.read(info.filename))
                                         for info in declared.infolist()])
    (tmp_path / "model.py").write_text(textwrap.dedent(MODEL))
    script = ("import resource, subprocess, sys\n"
              "base = int(open('/proc/self/status').read().split('VmSize:')[1].split()[0]) * 1024\n"
              "limit = base + (5 << 30)  # the interpreter here, torch in the child, and 2 GiB to spare\n"
              "sys.exit(subprocess.run(sys.argv[1:], preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, "
              "(limit, limit))).returncode)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_COLOR="1")
    done = subprocess.run([sys.executable, "-c", script, sys.executable, "-m", "preclint", "check", "model.py",
                           "--weights", "bomb.pt"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("preclint: error: bomb.pt: its tensors, whose records are compressed, would take "
                                  "4.0 GiB of memory to decompress, more than the "), done.stderr


# ------------------------------------------------------------------------------------- safetensors


def _safetensors(path: Path, header: dict, body: bytes, length=None) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text) if length is None else length) + text + body)


@pytest.mark.slow
def test_a_safetensors_header_that_lies_is_refused_as_the_safetensors_library_refuses_it(model, capsys):
    safetensors = pytest.importorskip("safetensors.torch")
    from safetensors import SafetensorError
    state = torch.load(model / "weights.pt", weights_only=True)
    safetensors.save_file(state, str(model / "good.safetensors"))
    raw = (model / "good.safetensors").read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header, body = json.loads(raw[8:8 + length]), raw[8 + length:]

    def changed(name, key, value):
        copy = json.loads(json.dumps(header))
        copy[name][key] = value
        return copy

    weight, bias = header["fc1.weight"]["data_offsets"], header["fc1.bias"]["data_offsets"]
    lies = {
        "huge_header": (header, body, 1 << 62, "its header declares 4611686018427387904 bytes, more than the file"),
        "header_past_the_file": (header, body, length + len(body) + 100, "bytes, more than the file holds"),
        "overlap": (changed("fc1.bias", "data_offsets", [weight[0], weight[0] + 128]), body, None, "overlap"),
        "negative_shape": (changed("fc1.weight", "shape", [-32, -16]), body, None, "not a list of whole numbers"),
        "trailing_bytes": (header, body + bytes(64), None, "its tensors end at byte"),
        "past_the_end": (changed("fc1.bias", "data_offsets", [bias[0] + len(body), bias[1] + len(body)]), body, None,
                         "past the end of the file"),
        "wrong_size": (changed("fc1.bias", "shape", [16]), body, None, "its entry 'fc1.bias' takes 128 bytes where"),
    }
    assert check(capsys, model, "good.safetensors")[0] == 0
    for name, (lying_header, lying_body, declared_length, needle) in lies.items():
        path = model / f"{name}.safetensors"
        _safetensors(path, lying_header, lying_body, declared_length)
        with pytest.raises(SafetensorError):  # the reference library reads none of them
            safetensors.load_file(str(path))
        code, out, err = check(capsys, model, path.name)
        assert (code, out) == (2, "") and err.count("\n") == 1, (name, err)
        assert err.startswith(f"preclint: error: {path}: cannot be read as safetensors: ") and needle in err, \
            (name, err)
