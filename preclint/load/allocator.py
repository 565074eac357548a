"""The command's process keeps the memory it frees for its next allocations (glibc's malloc).

A check allocates and frees temporaries the size of the model's activations at every node (the
statistics, the terms, the gradients of the backward pass) while it holds the activations
themselves. glibc serves blocks above a threshold (128 KiB at the start, raised as large blocks are
freed) with their own mappings, unmapped when freed, and hands the free top of its heap back to the
kernel beyond a trim threshold; the next temporary of that size then faults its pages in afresh. On
resnet50 that was about 44 000 of the check's 235 000 page faults, some 2 us each on the 2-core
machine. The command sets the thresholds glibc's own rule would reach once it had seen blocks of
32 MiB freed (mappings above 32 MiB, trimming beyond twice that), so that the model's activations
reuse freed memory from the start; blocks larger than that are still mapped and given back. Only
the command's own process does this (preclint.cli.main), never a process that imports preclint.
"""
from __future__ import annotations

import ctypes
import sys

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest adaptive mmap threshold on 64-bit machines
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # as glibc's rule sets it beside the mmap threshold


def keep_freed_memory() -> bool:
    """Set glibc's thresholds as above; False where the C library is not glibc's (or refuses)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        if not hasattr(libc, "gnu_get_libc_version"):  # musl's mallopt does nothing
            return False
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
