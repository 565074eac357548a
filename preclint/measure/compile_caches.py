"""The caches a compiled backend reads and writes: private to the run, new, and removed after.

Inductor writes the Python and C++ it generates into a cache directory and imports it from there; a
file already at the name it would write is imported as it is. The default directory is shared
(``$TMPDIR/torchinductor_$USER``, or ``TORCHINDUCTOR_CACHE_DIR``), so Python planted there by another
user of the machine, or restored with a CI cache, ran inside preclint, and so would a kernel in
Triton's cache (``TRITON_CACHE_DIR``, else ``~/.triton/cache``). So every compilation of a run uses one
directory that preclint makes for the run (``mkdtemp``: a new name, mode 0700, this user's) for both,
set in the environment only while the compiled model runs (Inductor's compile workers are handed the
same variables; where a torch does not hand them over, Inductor compiles in this process instead),
with the in-memory caches cleared when it comes into force, every persistent and remote cache of
Inductor and AOTAutograd off (``force_disable_caches``), and the directory removed when the run ends
(the command's end, or the interpreter's for the Python API).
"""
from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import tempfile
from typing import Dict, Iterator, Optional

from preclint.load import processes

# what the report says about them (no path: two runs print the same bytes)
CACHES = "private to this run (a new 0700 directory for Inductor's and Triton's files, removed after); " \
         "persistent and remote caches off"
_ENVIRONMENT = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
# Inductor's settings (torch 2.4 and later) that read or write a cache outside the run's directory
INDUCTOR_CACHES_OFF = {"force_disable_caches": True, "fx_graph_cache": False, "fx_graph_remote_cache": False,
                       "autotune_local_cache": False, "autotune_remote_cache": False,
                       "bundled_autotune_remote_cache": False}
AOT_AUTOGRAD_CACHES_OFF = {"enable_autograd_cache": False, "enable_remote_autograd_cache": False}

_directory: Optional[str] = None


def run_directory() -> str:
    """The run's cache directory, made on first use."""
    global _directory
    if _directory is None or not os.path.isdir(_directory):
        _directory = tempfile.mkdtemp(prefix="preclint-compile-")
        processes.at_end(remove_run_directory)
        atexit.register(remove_run_directory)
    return _directory


def remove_run_directory() -> None:
    global _directory
    if _directory is not None:
        shutil.rmtree(_directory, ignore_errors=True)
        _directory = None


def _variables(directory: str) -> Dict[str, str]:
    return {"TORCHINDUCTOR_CACHE_DIR": directory, "TRITON_CACHE_DIR": os.path.join(directory, "triton")}


@contextlib.contextmanager
def private_caches() -> Iterator[str]:
    """The run's directory as Inductor's and Triton's cache while the block runs; the variables are
    given back after it."""
    wanted = _variables(run_directory())
    before = {name: os.environ.get(name) for name in _ENVIRONMENT}
    os.environ.update(wanted)
    if before != wanted:
        _clear_in_memory()  # what was loaded from another directory is not served from memory either
    try:
        yield wanted["TORCHINDUCTOR_CACHE_DIR"]
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def worker_settings() -> Dict[str, int]:
    """Inductor settings for its compile workers: none where torch hands each task the cache
    variables (torch 2.14 does), else one compile thread, in this process, so that no worker started
    earlier with the shared directory in its environment compiles a kernel of the run."""
    try:
        from torch._inductor.runtime import compile_tasks
    except ImportError:
        return {"compile_threads": 1}
    return {} if hasattr(compile_tasks, "_WORKER_CACHE_ENV_VARS") else {"compile_threads": 1}


def _clear_in_memory() -> None:
    try:
        from torch._inductor.utils import clear_caches  # torch 2.5 and later
    except ImportError:
        try:
            from torch._inductor.utils import clear_inductor_caches as clear_caches
        except ImportError:
            return
    clear_caches()
