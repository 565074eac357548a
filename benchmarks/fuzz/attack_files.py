"""The attacks of benchmarks.fuzz.attacks made of files: planted links, FIFOs and edited entries in the
source cache, special files as baseline and configuration, ``exclude`` against named files, files of
many closeness checks, ``-o`` over the run's own inputs, and ``--fix`` over a file it cannot write.
What each must not do is said in benchmarks.fuzz.attacks."""
from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from typing import Dict, List

from benchmarks.fuzz.attack_oracle import judge_attack
from benchmarks.fuzz.attacks import (FIXABLE, HANG_TIMEOUT, SOURCE_FINDING, SOURCE_MORE, AttackCase, digest,
                                     findings_of, run, source_or_graph, write)
from benchmarks.fuzz.oracle import Checked, Verdict


# ------------------------------------------------------------------------------------ the cache


def _cache_files(directory: str) -> List[str]:
    found = [p for p in glob.glob(os.path.join(directory, "cache", "**", "*"), recursive=True)
             if os.path.isfile(p) and not os.path.islink(p)]
    return sorted(found)


def _victims(directory: str) -> Dict[str, str]:
    return {name: digest(os.path.join(directory, name)) for name in ("victim.txt", "victim.fifo", "victim")}


def cache_link(case: AttackCase, directory: str) -> Checked:
    argv = ["check", "--source-only", "proj/s.py", "--output-format", str(case.params["format"])]
    write(directory, "proj/s.py", SOURCE_FINDING)
    warm = run(argv, directory)
    verdict = judge_attack(warm, argv, {1})
    files = _cache_files(directory)
    if not verdict.ok or not files:
        return Checked(verdict, warm, extra={"planted": False})
    target = files[0]
    write(directory, "victim.txt", "precious\n")
    os.mkfifo(os.path.join(directory, "victim.fifo"))
    write(directory, "victim/keep.txt", "precious\n")
    if case.variant == "link-file":
        os.remove(target)
        os.symlink(os.path.join(directory, "victim.txt"), target)
    elif case.variant == "link-fifo":
        os.remove(target)
        os.symlink(os.path.join(directory, "victim.fifo"), target)
    elif case.variant in ("link-dir", "link-top"):
        relative = os.path.relpath(target, os.path.join(directory, "cache")).split(os.sep)
        linked = os.path.dirname(target) if case.variant == "link-dir" or len(relative) < 3 else \
            os.path.join(directory, "cache", relative[0])
        shutil.rmtree(linked)
        os.symlink(os.path.join(directory, "victim"), linked)
    elif case.variant == "fifo":
        os.remove(target)
        os.mkfifo(target)
    else:  # deep-json
        with open(target, "w") as f:
            f.write('{"format": 2, "files": ' + "[" * 200_000)
    write(directory, "proj/s.py", SOURCE_FINDING + SOURCE_MORE)  # a miss: the cache is written again
    before = _victims(directory)
    result = run(argv, directory)
    verdict = judge_attack(result, argv, {1})
    if verdict.ok:
        after = _victims(directory)
        changed = [name for name in before if after[name] != before[name]]
        if changed:
            verdict = Verdict("victim-changed", f"{changed[0]} was {before[changed[0]][:60]}, is {after[changed[0]][:60]}")
    return Checked(verdict, result)


def _edit_entry(entry: list, variant: str) -> bool:
    """Edit one cache entry ([printed, digest, [findings], [directives]]) as ``variant`` says; False
    when the entry is not of that layout (a later format: nothing to plant)."""
    if not (isinstance(entry, list) and len(entry) >= 4 and isinstance(entry[2], list) and entry[2]
            and isinstance(entry[2][0], list) and len(entry[2][0]) >= 7):
        return False
    record = entry[2][0]
    if variant == "severity":
        record[2] = "catastrophic"
    elif variant == "invent":
        entry[2].append(record[:3] + ["an invented finding"] + record[4:5] + [1, 1] + record[7:])
    elif variant == "hide":
        entry[2] = []
    elif variant == "message":
        record[3] = "x\n::error::INJ00 \x1b]8;;https://evil/INJ08\x07y"
    elif variant == "location":
        record[5] = 10 ** 9
    elif variant == "directive":
        entry[3].append([record[5], 1, "preclint", [record[0]], []])
    else:  # types
        record[5] = str(record[5])
    return True


def cache_edit(case: AttackCase, directory: str) -> Checked:
    write(directory, "proj/s.py", SOURCE_FINDING)
    truth_argv = ["check", "--source-only", "proj/s.py", "--output-format", "json"]
    warm = run(truth_argv, directory)
    verdict = judge_attack(warm, truth_argv, {1})
    files = _cache_files(directory)
    if not verdict.ok or not files:
        return Checked(verdict, warm, extra={"planted": False})
    truth = findings_of(warm.stdout)
    with open(files[0], encoding="utf-8") as f:
        try:
            doc = json.load(f)
        except ValueError:
            return Checked(Verdict(), warm, extra={"planted": False})
    entries = doc.get("files") if isinstance(doc, dict) else None
    planted = isinstance(entries, dict) and any(_edit_entry(e, case.variant) for e in entries.values())
    if not planted:
        return Checked(Verdict(), warm, extra={"planted": False})
    with open(files[0], "w", encoding="utf-8") as f:
        json.dump(doc, f)
    fmt = str(case.params["format"])
    argv = ["check", "--source-only", "proj/s.py", "--output-format", fmt]
    result = run(argv, directory)
    hostile = ["x\n::error::INJ00 \x1b]8;;https://evil/INJ08\x07y"] if case.variant == "message" else []
    verdict = judge_attack(result, argv, {0, 1}, payloads=hostile)
    if verdict.ok and fmt == "json" and findings_of(result.stdout) != truth:
        verdict = Verdict("misled", f"the edited cache ({case.variant}) changed the findings: "
                          f"{len(truth or [])} uncached, {len(findings_of(result.stdout) or [])} from the cache")
    if verdict.ok and result.rc != warm.rc:
        verdict = Verdict("exit-status", f"exit {result.rc} from the edited cache, {warm.rc} without it")
    return Checked(verdict, result)


# ------------------------------------------------------------------------------------ special files


def special_file(case: AttackCase, directory: str) -> Checked:
    argv = source_or_graph(case, directory) + ["--output-format", str(case.params["format"])]
    where = os.path.join(directory, "b.json")
    variant = case.variant
    if variant == "baseline-fifo":
        os.mkfifo(where)
    elif variant == "baseline-zero":
        os.symlink("/dev/zero", where)
    elif variant == "baseline-deep":
        write(directory, "b.json", "[" * 200_000 + "]" * 200_000)
    elif variant == "baseline-dir":
        os.mkdir(where)
    elif variant == "config-fifo":
        os.mkfifo(os.path.join(directory, "pyproject.toml"))
    elif variant == "config-zero":
        os.symlink("/dev/zero", os.path.join(directory, "pyproject.toml"))
    elif variant == "config-flag-zero":
        os.symlink("/dev/zero", os.path.join(directory, "conf.toml"))
        argv += ["--config", "conf.toml"]
    else:  # config-deep
        write(directory, "pyproject.toml", "[tool.preclint]\nselect = " + "[" * 100_000 + "]" * 100_000 + "\n")
    if variant.startswith("baseline"):
        argv += ["--baseline", "b.json"]
    hang = "fifo" in variant
    result = run(argv, directory, timeout=(HANG_TIMEOUT + (60 if case.params.get("graph") else 0)) if hang else None)
    return Checked(judge_attack(result, argv, {0, 1, 2}), result)


# ------------------------------------------------------------------------------------ exclude


def exclude(case: AttackCase, directory: str) -> Checked:
    if case.params.get("graph"):
        from benchmarks.fuzz.attack_models import plain_model

        write(directory, "proj/s.py", plain_model())
        argv = ["check", "proj/s.py", "--output-format", "json"]
    else:
        write(directory, "proj/s.py", SOURCE_FINDING)
        argv = ["check", "--source-only", "proj/s.py", "--output-format", "json"]
    write(directory, "pyproject.toml", f"[tool.preclint]\nexclude = [{json.dumps(case.variant)}]\n")
    isolated = run(argv + ["--isolated"], directory)
    verdict = judge_attack(isolated, argv, {1})
    if not verdict.ok:
        return Checked(verdict, isolated)
    result = run(argv, directory)
    verdict = judge_attack(result, argv, {0, 1})
    truth, got = findings_of(isolated.stdout), findings_of(result.stdout)
    if verdict.ok and got != truth and "exclude" not in result.stderr.lower():
        verdict = Verdict("silently-skipped", f"proj/s.py, named on the command line: {len(truth or [])} findings "
                          f"with --isolated, {len(got or [])} with exclude = [{case.variant!r}], and nothing said")
    return Checked(verdict, result)


# ------------------------------------------------------------------------------------ slow growth

GROWTH = {  # pattern -> one closeness check (and what it compares), the i-th
    "reassign": lambda i: "a = a.half()\nassert torch.allclose(a, b, rtol=1e-6)\n",
    "call": lambda i: "torch.testing.assert_close(x.half(), b, rtol=1e-5, atol=1e-8)\n",
    "chain": lambda i: f"a{i + 1} = a{i}.half()\ntorch.testing.assert_close(a{i + 1}, b, rtol=1e-5, atol=1e-8)\n",
    "function": lambda i: f"def test_{i}(x, b):\n    y = x.half()\n    assert torch.allclose(y, b, rtol=1e-6)\n",
    "method": lambda i: "a = a.half()\nassert a.allclose(b, rtol=1e-6)\n",
}


def slow_growth(case: AttackCase, directory: str) -> Checked:
    n = int(case.params["n"])  # type: ignore[arg-type]
    check = GROWTH[case.variant]
    seconds = {}
    result = None
    for count in (1, n, 4 * n):
        rel = f"proj/g{count}.py"
        write(directory, rel, "import torch\n\n" + "".join(check(i) for i in range(count)))
        argv = ["check", "--source-only", "--no-cache", rel, "--output-format", "concise"]
        result = run(argv, directory)
        verdict = judge_attack(result, argv, {1})
        if not verdict.ok:
            return Checked(verdict, result)
        seconds[count] = result.cpu
    extra = {"cpu": {str(k): round(v, 2) for k, v in seconds.items()}}
    return Checked(growth_verdict(seconds, n), result, extra)


def growth_verdict(seconds: Dict[int, float], n: int) -> Verdict:
    """CPU seconds of a file of 1, n and 4n checks: past the start-up (the file of one), 4n checks may
    take 4 times as long, give or take; 7 times (an exponent above 1.4) and over 2 s is not linear."""
    once, quadruple = seconds[n] - seconds[1], seconds[4 * n] - seconds[1]
    ratio = quadruple / max(once, 0.25)  # below a quarter of a second, the noise of a busy machine
    if ratio > 7 and quadruple > 2.0:
        return Verdict("slow-growth", f"{n} checks {once:.2f} s, {4 * n} checks {quadruple:.2f} s of CPU "
                       f"(x{ratio:.1f} for 4x the checks)")
    return Verdict()


# ------------------------------------------------------------------------------------ -o


def output_clash(case: AttackCase, directory: str) -> Checked:
    variant = case.variant
    fmt = str(case.params["format"])
    expected = {2}
    if variant in ("o-model", "o-weights"):
        from benchmarks.fuzz.attack_models import plain_model, save_weights

        write(directory, "m.py", plain_model())
        argv = ["check", "m.py"]
        if variant == "o-weights":
            save_weights(os.path.join(directory, "w.pt"), 1.0, 0)
            argv += ["--weights", "w.pt", "-o", "w.pt"]
            clash = "w.pt"
        else:
            argv += ["-o", "m.py"]
            clash = "m.py"
    else:
        write(directory, "proj/s.py", SOURCE_FINDING)
        argv = ["check", "--source-only", "proj/s.py"]
        clash = {"o-baseline": "b.json", "o-config": "pyproject.toml", "o-config-flag": "conf.toml",
                 "o-source": "proj/s.py", "o-link": "proj/s.py", "o-fifo": "out.fifo"}[variant]
        if variant == "o-baseline":
            made = run(argv + ["--write-baseline", "b.json"], directory)
            if made.rc != 0 or not os.path.isfile(os.path.join(directory, "b.json")):
                return Checked(judge_attack(made, argv, {0}), made)
            argv += ["--baseline", "b.json", "-o", "b.json"]
        elif variant == "o-config":
            write(directory, "pyproject.toml", '[project]\nname = "victim"\n\n[tool.preclint]\nselect = ["ALL"]\n')
            argv += ["-o", "pyproject.toml"]
        elif variant == "o-config-flag":
            write(directory, "conf.toml", 'select = ["ALL"]\n')
            argv += ["--config", "conf.toml", "-o", "conf.toml"]
        elif variant == "o-link":
            os.symlink(os.path.join("proj", "s.py"), os.path.join(directory, "out.txt"))
            argv += ["-o", "out.txt"]
        elif variant == "o-fifo":
            os.mkfifo(os.path.join(directory, "out.fifo"))
            argv += ["-o", "out.fifo"]
            expected = {0, 1, 2}
        else:
            argv += ["-o", "proj/s.py"]
    argv += ["--output-format", fmt]
    before = digest(os.path.join(directory, clash))
    result = run(argv, directory)
    verdict = judge_attack(result, argv, expected)
    after = digest(os.path.join(directory, clash))
    if after != before:  # the worse failure, whatever the exit status
        verdict = Verdict("input-overwritten", f"-o overwrote {clash}, an input of the run (exit {result.rc})")
    return Checked(verdict, result)


# ------------------------------------------------------------------------------------ --fix


def _make_unwritable(path: str) -> bool:
    """chmod 0444, and for root (whom modes do not stop) the immutable attribute; True when a write
    is then refused."""
    os.chmod(path, 0o444)
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", path], capture_output=True)
    try:
        with open(path, "r+b"):
            return False
    except OSError:
        return True


def _make_writable(path: str) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", path], capture_output=True)
    os.chmod(path, 0o644)


def fix_unwritable(case: AttackCase, directory: str) -> Checked:
    names = [f"proj/f{k}.py" for k in range(3)]
    for name in names:
        write(directory, name, FIXABLE)
    locked = names[{"first": 0, "middle": 1, "last": 2}[case.variant]]
    path = os.path.join(directory, locked)
    try:
        if not _make_unwritable(path):
            return Checked(Verdict(), None, extra={"planted": False})
        argv = ["check", "--source-only", "--fix"] + (["proj"] if case.params.get("directory") else names)
        argv += ["--output-format", "concise"]
        result = run(argv, directory)
    finally:
        _make_writable(path)
    verdict = judge_attack(result, argv, {1, 2})
    if not verdict.ok:
        return Checked(verdict, result)
    writable = [n for n in names if n != locked]
    changed = []
    for name in writable:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            if f.read() != FIXABLE:
                changed.append(name)
    said = result.stdout + result.stderr
    if 0 < len(changed) < len(writable):
        unfixed = [n for n in writable if n not in changed]
        verdict = Verdict("fix-partial", f"{locked} could not be written: {', '.join(changed)} fixed, "
                          f"{', '.join(unfixed)} not (stopped half-way)")
    elif changed and result.rc == 2 and any(os.path.basename(n) not in said for n in changed):
        verdict = Verdict("fix-unreported", f"exit 2 after fixing {', '.join(changed)}, which the output does not name")
    return Checked(verdict, result)
