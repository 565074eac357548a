"""Checking many files on every core the run may use, surviving a worker that dies.

Files go to a pool of worker processes (forked where the platform allows it: the workers start with
preclint and libcst already imported) in small batches, largest files first so that one big file
does not finish last alone. Parsing is guarded (preclint.text.guard), so no worker should die; if
one does all the same (a native crash), the files it had not finished are checked again one by one,
each in a process of its own, and a file that kills that process too is reported, not the run.
"""
from __future__ import annotations

import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Dict, List, Sequence, Tuple, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

MIN_FILES_PER_WORKER = 4  # below this a pool costs more than it saves
BATCH_BYTES = 256 * 1024  # a batch: files up to this many bytes together, or one larger file


def available_cores() -> int:
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


def _context():
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _batches(items: Sequence[Tuple[int, int]]) -> List[List[int]]:
    """Indices of ``items`` ((index, size) pairs) grouped into batches, largest files first."""
    batches: List[List[int]] = []
    current: List[int] = []
    size = 0
    for index, length in sorted(items, key=lambda item: -item[1]):
        if current and size + length > BATCH_BYTES:
            batches.append(current)
            current, size = [], 0
        current.append(index)
        size += length
    if current:
        batches.append(current)
    return batches


def _run_batch(fn, batch: List[Tuple[int, object]]) -> List[Tuple[int, object]]:
    return [(index, fn(item)) for index, item in batch]


def map_checked(
    fn: Callable[[Item], Result],
    items: Sequence[Item],
    sizes: Sequence[int],
    jobs: int,
    crashed: Callable[[Item], Result],
) -> List[Result]:
    """``[fn(item) for item in items]``, on ``jobs`` processes when there is enough to share; an item
    whose process dies alone gets ``crashed(item)``. ``fn`` must be a module-level function."""
    if jobs <= 1 or len(items) < MIN_FILES_PER_WORKER * 2:
        return [fn(item) for item in items]
    results: Dict[int, Result] = {}
    batches = _batches(list(enumerate(sizes)))
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(batches)), mp_context=_context()) as pool:
            futures = [pool.submit(_run_batch, fn, [(i, items[i]) for i in batch]) for batch in batches]
            for future in futures:
                try:
                    results.update(future.result())
                except BrokenProcessPool:
                    break
    except BrokenProcessPool:
        pass
    for index, item in enumerate(items):
        if index not in results:
            results[index] = _isolated(fn, item, crashed)
    return [results[i] for i in range(len(items))]


def _child(fn, item, connection) -> None:
    try:
        connection.send(("ok", fn(item)))
    except BaseException as exc:  # sent back, raised in the parent
        connection.send(("error", exc))
    finally:
        connection.close()


def _isolated(fn, item, crashed):
    """``fn(item)`` in a process of its own: a crash there is ``crashed(item)``."""
    context = _context()
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(fn, item, sender), daemon=True)
    process.start()
    sender.close()
    try:
        status, value = receiver.recv()
    except (EOFError, OSError):
        process.join()
        return crashed(item)
    finally:
        receiver.close()
    process.join()
    if status == "error":
        raise value
    return value
