"""Adversarial inputs to the command line: what preclint does with each mistake a user can make.

Every case runs `python -m preclint ...` in a fresh process (in a scratch directory holding small model
files) and is judged by one rule: a user mistake ends in one line on stderr and exit 2, never an
"internal error" or a traceback; a run that can report, reports one valid document; nothing the user
gave is replaced. The outcome of each case (exit code, the last line of stderr, the verdict) is written
to a JSON file, so two runs (before and after a change) can be put side by side:

    python benchmarks/adversarial.py --label before --root ../main --out benchmarks/results/adversarial.json
    python benchmarks/adversarial.py --label after --out benchmarks/results/adversarial.json

An existing output file is updated: the cases of this run are stored under ``--label``, the others kept.
"""
from __future__ import annotations

import argparse
import json
import os
import pickle
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Optional

if __package__ in (None, ""):  # run as a script: make `benchmarks` importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.provenance import git_commit, stamp  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def _tiny(forward: str, prelude: str = "") -> str:
    """A one-layer model whose forward runs ``forward``; ``prelude`` runs at import."""
    body = textwrap.indent(textwrap.dedent(forward).strip(), " " * 8)
    return (f"import torch\nfrom torch import nn\n{textwrap.dedent(prelude).strip()}\n\n\n"
            "class Tiny(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.fc = nn.Linear(8, 8)\n\n    def forward(self, x):\n{body}\n\n\n"
            "example_inputs = (torch.randn(2, 8),)\n")


MODELS = {
    "tiny.py": _tiny("return self.fc(x)"),
    "fails.py": _tiny('raise RuntimeError("this model always fails")'),
    "loops_forward.py": _tiny("while True:\n    x = x + 0"),
    "nan_out.py": _tiny("return torch.log(self.fc(x) - 100.0)"),
    "generator.py": _tiny("yield self.fc(x)"),
    "kbint.py": _tiny("raise KeyboardInterrupt"),
    "exit_forward.py": _tiny("sys.exit(5)", prelude="import sys"),
    "os_exit_forward.py": _tiny("os._exit(9)", prelude="import os"),
    "prints.py": _tiny('print("forward", x.shape)\nreturn self.fc(x)', prelude='print("loading the model")'),
    "thread.py": _tiny("return self.fc(x)", prelude="""
        import threading
        import time
        threading.Thread(target=time.sleep, args=(3600,)).start()
    """),
    "conv.py": """
        import torch
        from torch import nn

        class Conv(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3)

            def forward(self, x):
                return self.conv(x)
    """,
    "loops.py": """
        while True:
            pass
    """,
    "exit7.py": """
        import os
        os._exit(7)
    """,
    "sysexit.py": """
        import sys
        sys.exit(3)
    """,
    "warns.py": """
        import torch
        from torch import nn

        class Warns(nn.Module):
            def __init__(self):
                super().__init__()
                layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=False)
                self.enc = nn.TransformerEncoder(layer, 1)

            def forward(self, x):
                return torch.nn.functional.softmax(self.enc(x))

        example_inputs = (torch.randn(4, 2, 16),)
    """,
    "not_module.py": """
        def make():
            return 3

        model = 3
    """,
    "empty.py": "",
    "slow_import.py": """
        import time
        time.sleep(600)
    """,
    "two_inputs.py": """
        import torch
        from torch import nn

        class TwoInputs(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x, y):
                return self.fc(x) + y
    """,
}


@dataclass
class Case:
    name: str
    argv: List[str]
    expect: str  # what a correct run does, in words
    judge: Callable[["Outcome"], bool]
    setup: Optional[Callable[[str], None]] = None
    stdout_file: bool = False  # stdout goes to out.txt in the scratch directory
    signal_after: Optional[float] = None  # send SIGINT/SIGTERM after this many seconds
    signal_number: int = signal.SIGINT
    timeout: float = 120.0


@dataclass
class Outcome:
    rc: Optional[int]
    stdout: str
    stderr: str
    seconds: float
    directory: str
    extra: dict = field(default_factory=dict)

    @property
    def last_line(self) -> str:
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    @property
    def one_line_error(self) -> bool:
        lines = [line for line in self.stderr.strip().splitlines() if line.strip()]
        return (
            self.rc == 2
            and len(lines) >= 1
            and lines[-1].startswith(("preclint: error:", "preclint check: error:"))  # the latter: argparse's
            and "unrecognized arguments" not in self.stderr  # a flag that does not exist yet
            and "internal error" not in self.stderr
            and "Traceback" not in self.stderr
        )


def user_error(outcome: Outcome) -> bool:
    return outcome.one_line_error


def timed_out(outcome: Outcome) -> bool:
    return outcome.one_line_error and "time" in outcome.last_line and outcome.seconds < 40


def json_doc(outcome: Outcome):
    try:
        return json.loads(outcome.stdout)
    except ValueError:
        return None


def _write_models(directory: str) -> None:
    for name, source in MODELS.items():
        with open(os.path.join(directory, name), "w") as handle:
            handle.write(textwrap.dedent(source))
    with open(os.path.join(directory, "latin1.py"), "wb") as handle:
        handle.write(b"# caf\xe9\nx = 1\n")
    os.mkdir(os.path.join(directory, "adir"))
    os.mkdir(os.path.join(directory, "pyproject_dir"))
    os.mkdir(os.path.join(directory, "pyproject_dir", "pyproject.toml"))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    with open(os.path.join(directory, "evil.pt"), "wb") as handle:
        pickle.dump(Evil(), handle, protocol=2)  # the protocol torch.save writes


def _config(directory: str, text: str) -> str:
    path = os.path.join(directory, "cfg.toml")
    with open(path, "w") as handle:
        handle.write(text)
    return path


def _baseline(count) -> Callable[[str], None]:
    def setup(directory: str) -> None:
        with open(os.path.join(directory, "base.json"), "w") as handle:
            handle.write('{"format": "preclint-baseline", "version": 1, "findings": '
                         '[{"path": "tiny.py", "code": "PCL001", "fingerprint": "x", "count": %s}]}' % count)
    return setup


def _mkfifo(directory: str) -> None:
    os.mkfifo(os.path.join(directory, "fifo"))


def _fifo_kept(outcome: Outcome) -> bool:
    return stat.S_ISFIFO(os.lstat(os.path.join(outcome.directory, "fifo")).st_mode)


def cases() -> List[Case]:
    c = ["check"]
    quiet = ["--output-format", "concise"]
    out: List[Case] = [
        # --- data replaced
        # a copy of /dev/full in the scratch directory (mknod, as root), so the run cannot replace the real one
        Case("write-baseline /dev/full", c + ["tiny.py", "--write-baseline", "full"] + quiet,
             "one-line error (device full), the device stays a device",
             lambda o: user_error(o) and stat.S_ISCHR(os.lstat(os.path.join(o.directory, "full")).st_mode),
             setup=lambda d: os.mknod(os.path.join(d, "full"), 0o666 | stat.S_IFCHR, os.makedev(1, 7))),
        Case("write-baseline FIFO", c + ["tiny.py", "--write-baseline", "fifo"] + quiet,
             "the FIFO stays a FIFO", lambda o: _fifo_kept(o), setup=_mkfifo),
        Case("write-baseline /dev/stdout > out.txt", c + ["tiny.py", "--write-baseline", "/dev/stdout"] + quiet,
             "refused: baseline and report would share stdout", user_error, stdout_file=True),
        Case("write-baseline directory", c + ["tiny.py", "--write-baseline", "adir"] + quiet,
             "one-line error", user_error),
        Case("write-baseline directory (source-only)", c + ["--source-only", "tiny.py", "--write-baseline", "adir"],
             "one-line error", user_error),
        # --- hangs
        Case("model loops at import, --timeout 5", c + ["loops.py", "--timeout", "5"] + quiet,
             "one-line error after about 5 s", timed_out, timeout=60),
        Case("forward loops, --timeout 5", c + ["loops_forward.py", "--timeout", "5"] + quiet,
             "one-line error after about 5 s", timed_out, timeout=60),
        Case("time.sleep at import, --timeout 3", c + ["slow_import.py", "--timeout", "3"] + quiet,
             "one-line error after about 3 s", timed_out, timeout=60),
        # --- invalid or lost output
        Case("two models, sarif", c + ["tiny.py", "conv.py:Conv", "--input-shape", "1,3,8,8", "--output-format", "sarif"],
             "one valid SARIF document", lambda o: o.rc in (0, 1) and json_doc(o) is not None),
        Case("two models, rdjson", c + ["tiny.py", "tiny.py", "--output-format", "rdjson", "--exit-zero"],
             "one valid rdjson document", lambda o: o.rc == 0 and json_doc(o) is not None),
        Case("one of two models fails, json", c + ["tiny.py", "fails.py", "--output-format", "json"],
             "exit 2, one JSON document with both models, the failure as an error entry",
             lambda o: o.rc == 2 and isinstance(json_doc(o), list) and len(json_doc(o)) == 2
             and "error" in json_doc(o)[1]),
        Case("one of two models fails, sarif", c + ["tiny.py", "fails.py", "--output-format", "sarif"],
             "exit 2, SARIF with executionSuccessful false",
             lambda o: o.rc == 2 and json_doc(o) is not None
             and any(not inv.get("executionSuccessful", True)
                     for run in json_doc(o)["runs"] for inv in run.get("invocations", []))),
        # --- user mistakes reported as internal errors
        Case("huge input shape", c + ["conv.py", "--input-shape", "1,3,100000,100000"] + quiet, "one-line error", user_error),
        Case("huge input shape --no-run", c + ["conv.py", "--input-shape", "1,3,100000,100000", "--no-run"] + quiet,
             "a report or one-line error", lambda o: o.rc in (0, 1) or user_error(o)),
        Case("20-digit dimension", c + ["conv.py", "--input-shape", "1,3,99999999999999999999,8"] + quiet,
             "one-line error", user_error),
        Case("dtype float8_e4m3fn", c + ["tiny.py:Tiny", "--input-shape", "2,8", "--input-dtype", "float8_e4m3fn"] + quiet,
             "one-line error", user_error),
        Case("dtype qint8", c + ["tiny.py:Tiny", "--input-shape", "2,8", "--input-dtype", "qint8"] + quiet,
             "one-line error", user_error),
        Case("dtype nonsense", c + ["tiny.py:Tiny", "--input-shape", "2,8", "--input-dtype", "Tensor"] + quiet,
             "one-line error", user_error),
        Case("exclude [z-a]", c + ["--source-only", ".", "--config", "cfg.toml"], "one-line error", user_error,
             setup=lambda d: _config(d, 'exclude = ["[z-a]"]\n')),
        Case("per-file-ignores [z-a]", c + ["--source-only", ".", "--config", "cfg.toml"], "one-line error", user_error,
             setup=lambda d: _config(d, '[per-file-ignores]\n"[z-a]" = ["PCL501"]\n')),
        Case("baseline count 1e999", c + ["tiny.py", "--baseline", "base.json"] + quiet, "one-line error", user_error,
             setup=_baseline("1e999")),
        Case("baseline count -3", c + ["tiny.py", "--baseline", "base.json"] + quiet, "one-line error", user_error,
             setup=_baseline("-3")),
        Case("baseline count 2.5", c + ["tiny.py", "--baseline", "base.json"] + quiet, "one-line error", user_error,
             setup=_baseline("2.5")),
        Case("baseline is a directory", c + ["tiny.py", "--baseline", "adir"] + quiet, "one-line error", user_error),
        # --- silently wrong
        Case("--rtol nan", c + ["tiny.py", "--rtol", "nan"] + quiet, "one-line error", user_error),
        Case("--rtol inf", c + ["tiny.py", "--rtol", "inf"] + quiet, "one-line error", user_error),
        Case("--rtol -1", c + ["tiny.py", "--rtol", "-1"] + quiet, "one-line error", user_error),
        Case("--rtol 1e400", c + ["tiny.py", "--rtol", "1e400"] + quiet, "one-line error", user_error),
        Case("--atol nan in config", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: _config(d, "atol = nan\n")),
        Case("--precision ''", c + ["tiny.py", "--precision", ""] + quiet, "one-line error", user_error),
        Case("--precision ,,,", c + ["tiny.py", "--precision", ",,,"] + quiet, "one-line error", user_error),
        Case("precisions = []", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: _config(d, "precisions = []\n")),
        Case("--select ''", c + ["tiny.py", "--select", ""] + quiet, "one-line error", user_error),
        Case("select = []", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: _config(d, "select = []\n")),
        Case("fp32 output NaN", c + ["nan_out.py", "--output-format", "json"],
             "PCL002 and a summary that does not claim a finite, error-free output",
             lambda o: o.rc == 1 and json_doc(o) is not None
             and all(m["predicted_output"]["finite"] is not True for m in json_doc(o)["summary"].values())),
        Case("malicious pickle --weights", c + ["tiny.py", "--weights", "evil.pt"] + quiet,
             "one-line error naming the reason, not cut", lambda o: user_error(o) and "system" in o.last_line
             and not o.last_line.rstrip().endswith("…") and "pwned" not in o.stdout),
        Case("os._exit(7) at import", c + ["exit7.py"] + quiet, "one-line error, exit 2", user_error),
        Case("os._exit(9) in forward", c + ["os_exit_forward.py"] + quiet, "one-line error, exit 2", user_error),
        Case("sys.exit(3) at import", c + ["sysexit.py"] + quiet, "one-line error, exit 2", user_error),
        Case("sys.exit(5) in forward", c + ["exit_forward.py"] + quiet, "one-line error, exit 2", user_error),
        Case("KeyboardInterrupt in forward", c + ["kbint.py"] + quiet, "one-line error, exit 2", user_error),
        Case("extra --input-shape", c + ["tiny.py:Tiny", "--input-shape", "2,8", "--input-shape", "2,8"] + quiet,
             "one-line error", user_error),
        Case("one --input-shape for two inputs", c + ["two_inputs.py", "--input-shape", "2,8"] + quiet,
             "one-line error", user_error),
        Case("--input-shape 0,8", c + ["tiny.py:Tiny", "--input-shape", "0,8"] + quiet, "one-line error", user_error),
        Case("model prints to stdout, json", c + ["prints.py", "--output-format", "json"],
             "one valid JSON document", lambda o: o.rc in (0, 1) and json_doc(o) is not None),
        Case("model leaves a thread running", c + ["thread.py"] + quiet, "the run ends with its report",
             lambda o: o.rc in (0, 1) and "checks passed" in o.stdout, timeout=90),
        Case("torch UserWarnings", c + ["warns.py"] + quiet, "no warning text on stderr",
             lambda o: o.rc in (0, 1) and "Warning" not in o.stderr),
        Case("SIGINT while importing", c + ["slow_import.py"] + quiet, "exit 130 and one line",
             lambda o: o.rc == 130 and len(o.stderr.strip().splitlines()) == 1, signal_after=8.0),
        Case("SIGTERM while importing", c + ["slow_import.py"] + quiet, "exit 143 and one line",
             lambda o: o.rc == 143 and len(o.stderr.strip().splitlines()) == 1, signal_after=8.0,
             signal_number=signal.SIGTERM),
        # --- the root-cause sweep
        Case("empty model file", c + ["empty.py"] + quiet, "one-line error", user_error),
        Case("non-UTF-8 model file", c + ["latin1.py"] + quiet, "one-line error", user_error),
        Case("directory as model", c + ["adir"] + quiet, "one-line error", user_error),
        Case("model.py:NoSuchAttr", c + ["tiny.py:NoSuchAttr"] + quiet, "one-line error", user_error),
        Case("model = 3", c + ["not_module.py"] + quiet, "one-line error", user_error),
        Case("--model returning int", c + ["not_module.py:make"] + quiet, "one-line error", user_error),
        Case("forward returns a generator", c + ["generator.py"] + quiet, "one-line error", user_error),
        Case("--seed 2**70", c + ["tiny.py", "--seed", str(2 ** 70)] + quiet, "one-line error about the seed",
             lambda o: user_error(o) and "seed" in o.last_line),
        Case("--seed -1", c + ["tiny.py", "--seed", "-1"] + quiet, "one-line error or a report",
             lambda o: user_error(o) or o.rc in (0, 1)),
        Case("--timeout 0 (no limit)", c + ["tiny.py", "--timeout", "0"] + quiet, "a report", lambda o: o.rc in (0, 1)),
        Case("--timeout -1", c + ["tiny.py", "--timeout", "-1"] + quiet, "one-line error", user_error),
        Case("--timeout nan", c + ["tiny.py", "--timeout", "nan"] + quiet, "one-line error", user_error),
        Case("config unknown key", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: _config(d, "selct = ['PCL1']\n")),
        Case("config wrong type", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: _config(d, "rtol = 'small'\n")),
        Case("config timeout wrong type", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error",
             lambda o: user_error(o) and "timeout must" in o.last_line, setup=lambda d: _config(d, "timeout = 'long'\n")),
        Case("config per-file-ignores not a table", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error",
             user_error, setup=lambda d: _config(d, "per-file-ignores = 3\n")),
        Case("invalid TOML", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: _config(d, "select = [\n")),
        Case("non-UTF-8 TOML", c + ["tiny.py", "--config", "cfg.toml"] + quiet, "one-line error", user_error,
             setup=lambda d: open(os.path.join(d, "cfg.toml"), "wb").write(b"select = ['\xe9']\n")),
        Case("config is a directory", c + ["tiny.py", "--config", "pyproject_dir/pyproject.toml"] + quiet,
             "one-line error", user_error),
        Case("--weights is a directory", c + ["tiny.py", "--weights", "adir"] + quiet, "one-line error", user_error),
        Case("--weights empty file", c + ["tiny.py", "--weights", "empty.py"] + quiet, "one-line error", user_error),
        Case("missing model file", c + ["nope.py"] + quiet, "one-line error", user_error),
        Case("source-only on non-UTF-8 file", c + ["--source-only", "latin1.py"], "a report",
             lambda o: o.rc in (0, 1) and "internal error" not in o.stderr),
    ]
    return out


def run_case(case: Case, python: str, root: str = ROOT) -> dict:
    directory = tempfile.mkdtemp(prefix="preclint-adv-")
    _write_models(directory)
    if case.setup is not None:
        case.setup(directory)
    env = dict(os.environ, PYTHONPATH=root, NO_COLOR="1")
    stdout = open(os.path.join(directory, "out.txt"), "w+") if case.stdout_file else subprocess.PIPE
    start = time.perf_counter()
    proc = subprocess.Popen([python, "-m", "preclint"] + case.argv, cwd=directory, env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True)
    try:
        if case.signal_after is not None:
            time.sleep(case.signal_after)
            proc.send_signal(case.signal_number)
        out, err = proc.communicate(timeout=case.timeout)
        rc: Optional[int] = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        rc = None
    seconds = time.perf_counter() - start
    if case.stdout_file:
        stdout.seek(0)
        out = stdout.read()
        stdout.close()
    outcome = Outcome(rc, out or "", err or "", seconds, directory)
    try:
        ok = bool(case.judge(outcome))
    except Exception:  # a judge that cannot read the outcome: not what was expected
        ok = False
    return {
        "case": case.name,
        "command": "preclint " + " ".join(case.argv) + (" > out.txt" if case.stdout_file else ""),
        "expected": case.expect,
        "rc": rc if rc is not None else f"timeout after {case.timeout:.0f} s",
        "stderr": outcome.last_line,
        "seconds": round(seconds, 1),
        "ok": ok,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--out", default=None, help="JSON file to update (default: print)")
    parser.add_argument("-k", dest="only", default=None, help="only cases whose name contains this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--root", default=ROOT, help="the checkout whose preclint runs (default: this one)")
    args = parser.parse_args()
    selected = [case for case in cases() if args.only is None or args.only in case.name]
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda case: run_case(case, sys.executable, args.root), selected))
    for r in results:
        print(f"{'ok ' if r['ok'] else 'BAD'} {r['rc']!s:>4} {r['case']}: {r['stderr'][:150]}")
    print(f"{sum(r['ok'] for r in results)}/{len(results)} as expected")
    if args.out:
        document = {}
        if os.path.exists(args.out):
            with open(args.out) as handle:
                document = json.load(handle)
        document.setdefault("cases", {})
        for r in results:
            entry = document["cases"].setdefault(r["case"], {"command": r["command"], "expected": r["expected"]})
            entry["command"], entry["expected"] = r["command"], r["expected"]
            entry[args.label] = {k: r[k] for k in ("rc", "stderr", "ok")}
        document["summary"] = {
            label: f"{sum(1 for e in document['cases'].values() if e.get(label, {}).get('ok'))}"
                   f"/{sum(1 for e in document['cases'].values() if label in e)} as expected"
            for label in sorted({k for e in document["cases"].values() for k in e if k not in ("command", "expected")})
        }
        document.setdefault("checkouts", {})[args.label] = {"root": args.root, "commit": git_commit(Path(args.root))}
        document = stamp(document)
        with open(args.out, "w") as handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")


if __name__ == "__main__":
    main()
