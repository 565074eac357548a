"""How much memory this process can still take, for refusing a file that would need more.

Where preclint has to read a file into memory rather than map it (a checkpoint whose records are
compressed), what it would take is compared with what there is, so that a zip bomb (a few kilobytes
declaring gigabytes) ends in one line instead of the kernel's out-of-memory killer or a swapping host.
"""
from __future__ import annotations

import os
import sys
from typing import List, Optional


def available_memory() -> Optional[int]:
    """Bytes this process can still allocate: on Linux the least of what the kernel counts as available
    (MemAvailable), what its cgroups allow beyond their use, and what its address-space limit leaves;
    elsewhere the physical memory the platform reports; None where nothing says."""
    room: List[int] = []
    if sys.platform.startswith("linux"):
        for value in (_kb_field("/proc/meminfo", "MemAvailable:"), _cgroup_room(), _address_space_room()):
            if value is not None:
                room.append(value)
    if not room:
        try:
            free = "SC_AVPHYS_PAGES" if "SC_AVPHYS_PAGES" in os.sysconf_names else "SC_PHYS_PAGES"  # macOS: no free count
            room.append(os.sysconf(free) * os.sysconf("SC_PAGE_SIZE"))
        except (AttributeError, ValueError, OSError):
            return None
    return max(min(room), 0)


def _kb_field(path: str, field: str) -> Optional[int]:
    """A ``Field:   123 kB`` line of a /proc file, in bytes."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_room() -> Optional[int]:
    """The least limit-less-use of this process's memory cgroup and its ancestors (v2), or of its v1
    memory cgroup; None without a limit. Inside a cgroup namespace the process's own cgroup is the
    mount's root, which is looked at too."""
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    candidates = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            base, limit_name, usage_name = "/sys/fs/cgroup", "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes"
        else:
            continue
        directory = path.strip("/")
        while True:
            candidates.append((os.path.join(base, directory), limit_name, usage_name))
            if not directory:
                break
            directory = os.path.dirname(directory)
    room = None
    for directory, limit_name, usage_name in candidates:
        limit = _read_int(os.path.join(directory, limit_name))
        usage = _read_int(os.path.join(directory, usage_name))
        if limit is None or usage is None or limit >= 1 << 60:  # v1 writes a near-2**63 number for no limit
            continue
        room = limit - usage if room is None else min(room, limit - usage)
    return room


def _address_space_room() -> Optional[int]:
    """What ``ulimit -v`` (RLIMIT_AS) leaves beyond the address space in use; None without a limit."""
    try:
        import resource
    except ImportError:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - (_kb_field("/proc/self/status", "VmSize:") or 0)


def format_bytes(count: int) -> str:
    """``count`` bytes in binary units, as people read them (``3.0 GiB``)."""
    units = ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB")
    value, unit = float(count), 0
    while value >= 1024 and unit < len(units) - 1:
        value, unit = value / 1024, unit + 1
    return f"{count} bytes" if unit == 0 else f"{value:.1f} {units[unit]}"
