"""The command's process keeps the memory it frees (load/allocator.py): a block below 32 MiB comes
from the heap, where freed blocks are reused, rather than from a mapping of its own that is unmapped
when freed (and faulted in afresh for the next one)."""
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

_ALLOCATE = """
import ctypes, sys
from preclint.load.allocator import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    sys.exit(3)
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def mappings():
    with open("/proc/self/maps") as maps:
        return len(maps.readlines())
before = mappings()
block = libc.malloc(16 << 20)
print(mappings() - before)
libc.free(block)
"""


def _new_mappings(mode: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _ALLOCATE, mode], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


@pytest.mark.subprocess
@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.path.exists("/proc/self/maps")
                         and "CS_GNU_LIBC_VERSION" in os.confstr_names and os.confstr("CS_GNU_LIBC_VERSION")),
                    reason="glibc's malloc on Linux")
def test_a_block_below_the_threshold_comes_from_the_heap():
    assert _new_mappings("default") == 1  # glibc's own: a mapping of its own
    assert _new_mappings("keep") == 0


def test_the_command_keeps_freed_memory_and_a_library_user_does_not(monkeypatch):
    import preclint.cli as cli
    from preclint.capture import usercode
    from preclint.load import allocator, processes

    calls = []
    monkeypatch.setattr(allocator, "keep_freed_memory", lambda: calls.append(1) or True)
    monkeypatch.setattr(processes, "take_charge", lambda: None)
    monkeypatch.setattr(processes, "end_descendants", lambda *a: None)
    monkeypatch.setattr(usercode, "end_process", lambda code: None)
    monkeypatch.setattr(cli, "_main", lambda argv: 0)
    cli.main(["rule", "PCL101"])  # a caller's arguments: preclint is a library in its process
    assert calls == []
    cli.main()  # the command's own process
    assert calls == [1]
