"""Shrinking a failing case to a small reproducer that fails the same way (the same signature).

Delta debugging (Zeller's ddmin) over the lines of the file, then over the tokens of what is left,
then over the command line's flags. A candidate counts when it fails with the same signature, so a
shrink never turns one bug into another (a file cut into a syntax error fails differently).
"""
from __future__ import annotations

import re
from typing import Callable, List, Sequence, TypeVar

T = TypeVar("T")


def ddmin(items: Sequence[T], fails: Callable[[List[T]], bool], budget: int = 400) -> List[T]:
    """A 1-minimal sublist of ``items`` for which ``fails`` holds (``fails(items)`` must), trying at
    most ``budget`` candidates."""
    items = list(items)
    n = 2
    tries = 0
    while len(items) >= 2 and tries < budget:
        chunk = max(1, len(items) // n)
        reduced = False
        for start in range(0, len(items), chunk):
            complement = items[:start] + items[start + chunk:]
            tries += 1
            if complement and fails(complement):
                items = complement
                n = max(n - 1, 2)
                reduced = True
                break
            if tries >= budget:
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(n * 2, len(items))
    return items


def blocks(text: str) -> List[str]:
    """The lines of ``text`` grouped into statements with the lines indented under them, so that a
    removal takes a whole block (a class, a function, an ``if``) at once."""
    groups: List[str] = []
    for line in text.split("\n"):
        if groups and (line[:1] in (" ", "\t") or not line.strip()) and not groups[-1].endswith("\\"):
            groups[-1] += "\n" + line
        else:
            groups.append(line)
    return groups


def minimize_text(text: str, fails: Callable[[str], bool], budget: int = 400) -> str:
    """``text`` shrunk: top-level blocks, then lines, then tokens."""
    kept = ddmin(blocks(text), lambda parts: fails("\n".join(parts)), budget // 3)
    text = "\n".join(kept)
    lines = ddmin(text.split("\n"), lambda parts: fails("\n".join(parts)), budget // 3)
    text = "\n".join(lines)
    if len(text) < 20_000:
        tokens = re.findall(r"\w+|\s+|.", text, re.S)
        text = "".join(ddmin(tokens, lambda parts: fails("".join(parts)), budget // 3))
    return text


def flag_groups(argv: Sequence[str]) -> List[List[str]]:
    """The command line as [flag, value] groups (a lone flag or a positional stays alone)."""
    groups: List[List[str]] = []
    i = 0
    while i < len(argv):
        if argv[i].startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--") \
                and not argv[i + 1].endswith(".py") and argv[i] not in _SWITCHES:
            groups.append([argv[i], argv[i + 1]])
            i += 2
        else:
            groups.append([argv[i]])
            i += 1
    return groups


_SWITCHES = {"--no-run", "--exit-zero", "--ablate", "--fix", "--diff", "--unsafe-fixes", "--no-cache", "--source-only",
             "--isolated", "--debug"}


def minimize_argv(argv: Sequence[str], fails: Callable[[List[str]], bool], keep: int = 1) -> List[str]:
    """Flags that the failure does not need, dropped (the first ``keep`` words, the command, stay)."""
    head, groups = list(argv[:keep]), flag_groups(argv[keep:])
    kept = ddmin(groups, lambda gs: fails(head + [w for g in gs for w in g]), budget=60)
    return head + [w for g in kept for w in g]


# ------------------------------------------------------------------------------------ running candidates

def run_forked(argv: Sequence[str], files: "dict", timeout: float = 120.0):
    """Run ``preclint`` on ``files`` (name -> text or bytes) in a forked child of this process (which
    must have done no torch work: forking after it can hang OpenMP), judged as the oracle judges a
    run. Much faster than a fresh interpreter; a signal that kills the child is seen as one."""
    import os
    import signal
    import tempfile
    import time

    from benchmarks.fuzz.oracle import Run, write_case_files

    directory = tempfile.mkdtemp(prefix="shrink-")
    write_case_files(directory, {k: v for k, v in files.items() if isinstance(v, str)},
                     {k: v for k, v in files.items() if isinstance(v, bytes)})
    out_path, err_path = os.path.join(directory, ".out"), os.path.join(directory, ".err")
    start = time.perf_counter()
    pid = os.fork()
    if pid == 0:  # the child: run and leave without any clean-up of the parent's
        try:
            os.setsid()
            os.chdir(directory)
            out = os.open(out_path, os.O_WRONLY | os.O_CREAT)
            err = os.open(err_path, os.O_WRONLY | os.O_CREAT)
            os.dup2(out, 1)
            os.dup2(err, 2)
            import io
            import sys

            sys.stdout = io.TextIOWrapper(os.fdopen(1, "wb", closefd=False), write_through=True)
            sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", closefd=False), write_through=True)
            from preclint.cli import main

            code = main(list(argv))
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
            os._exit(70)
    rc = None
    while time.perf_counter() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            rc = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
            break
        time.sleep(0.02)
    if rc is None:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    with open(out_path, encoding="utf-8", errors="replace") as f:
        out_text = f.read()
    with open(err_path, encoding="utf-8", errors="replace") as f:
        err_text = f.read()
    import shutil

    shutil.rmtree(directory, ignore_errors=True)
    return Run(rc, out_text, err_text, time.perf_counter() - start)


# ------------------------------------------------------------------------------------ whole cases

def signature_in_fork(case, timeout: float = 120.0) -> str:
    """The oracle's signature for ``case`` ("" when it passes), checked in a forked child, so that a
    case that kills or hangs its process is seen as the long run sees it (a signal, a time limit)."""
    import os
    import signal
    import time

    from benchmarks.fuzz import cases

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: check, report the signature, leave without the parent's clean-up
        try:
            os.close(read)
            os.setsid()
            verdict = cases.check(case).verdict
            os.write(write, (verdict.signature if not verdict.ok else "").encode())
        finally:
            os._exit(0)
    os.close(write)
    start = time.monotonic()
    status = None
    while time.monotonic() - start < timeout:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.02)
        status = None
    if status is None:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)
        return "hang: harness time limit"
    with os.fdopen(read, "rb") as f:
        answer = f.read().decode()
    if os.WIFSIGNALED(status):
        return f"crash: signal {signal.Signals(os.WTERMSIG(status)).name}"
    return answer


def shrink_case(case, timeout: float = 120.0, budget: int = 300):
    """``case`` made small (its largest file, then its flags), failing with the same signature; None
    when it does not fail."""
    import dataclasses

    wanted = signature_in_fork(case, timeout)
    if not wanted:
        return None

    def fails(candidate) -> bool:
        return signature_in_fork(candidate, timeout) == wanted

    if hasattr(case, "files"):  # a model case: its largest file, then its flags
        name = max(case.files, key=lambda n: len(case.files[n]))
        text = minimize_text(case.files[name], lambda t: fails(dataclasses.replace(case, files={**case.files, name: t})),
                             budget)
        case = dataclasses.replace(case, files={**case.files, name: text})
        argv = minimize_argv(case.argv, lambda a: fails(dataclasses.replace(case, argv=a)), keep=2)
        return dataclasses.replace(case, argv=argv)
    if case.mode != "many":  # a source case: the mutated file, then the flags
        text = case.data.decode("utf-8", "surrogateescape")
        text = minimize_text(text, lambda t: fails(dataclasses.replace(case, data=t.encode("utf-8", "surrogateescape"))),
                             budget)
        case = dataclasses.replace(case, data=text.encode("utf-8", "surrogateescape"))
    if case.argv:
        case = dataclasses.replace(case, argv=minimize_argv(case.argv, lambda a: fails(dataclasses.replace(case, argv=a))))
    return case
