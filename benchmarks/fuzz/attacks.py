"""The attack family of the fuzzer: cases ``attack-SEED`` that try preclint as an attacker would, with
what a repository, a file name, a model, a cache or a checkpoint can hold (the issue "Trust in CI").

Each seed picks a class of attack and a variant of it, and the parameters (output format, hostile
names, sizes); ``check_attack_case`` builds the files in the case's scratch directory, runs preclint's
command line in a child process under a wall-clock and a memory limit
(benchmarks.fuzz.attack_oracle.run_limited) and judges it (attack_oracle.judge_attack, and the checks
of the class here). The classes:

- ``names``: hostile names (newline + ``::cmd::``, ESC/OSC/C1 controls, bidi overrides, console
  markup, HTML tags, ``%``, ``:``, ``,``) as module names, a model file's name, source files' and a
  directory's names (more than ten findings: GitHub's cap) and an exception's message, in every
  output format;
- ``cache-link``: a symlink (to a victim file, a FIFO, a directory), a FIFO or deep JSON planted in
  PRECLINT_CACHE_DIR: the victim must stay as it was;
- ``cache-edit``: a hand-edited cache entry (bogus severity, invented, hidden, suppressed or moved
  findings, a hostile message): the run reports what an uncached run reports;
- ``checkpoint``: ``--weights`` re-zipped (deflate, stored without alignment) must read as the
  original; a zip bomb, a truncated or lying zip, a pickle that runs code, broken safetensors must be
  refused (exit 2) within the limits;
- ``special-file``: a FIFO, /dev/zero, a directory or deeply nested data as ``--baseline`` or as the
  configuration (found or named): no hang, no memory blow-up, no crash;
- ``exclude``: ``exclude`` patterns in [tool.preclint] against a file named on the command line: the
  file is checked (as with --isolated) or the run says it was excluded;
- ``slow-growth``: files of 1, n and 4n closeness checks: the source check's time grows linearly;
- ``fork``, ``nondeterministic``, and the checkpoint runs: benchmarks.fuzz.attack_models (the runs
  through caches, special files, configuration, ``-o`` and ``--fix``: benchmarks.fuzz.attack_files);
- ``output-clash``: ``-o`` naming the run's own baseline, configuration, source, model or weights (or
  a symlink to one), or a FIFO nobody reads: refused, the input unchanged, no hang;
- ``fix-unwritable``: ``--fix`` over files one of which cannot be written: the others are all fixed or
  none is, and what changed is named;
- ``answers``: inputs whose answer must stay true (broken checkpoints in ``diff``, activations whose
  squares overflow float32, an amax floor that zeroes the GEMMs, lossy checkpoint casts):
  benchmarks.fuzz.attack_answers.
- ``api-state``: a model that changes process state (TF32 through either API, the working directory,
  sys.path, the environment, modes, the default device, module hooks, dynamo settings), checked
  through ``preclint.check`` from the main thread or another: the caller reads it all as before, and
  a hanging forward ends at ``timeout`` (benchmarks.fuzz.attack_api).
- ``stdout-encoding``, ``lone-surrogate``, ``nothing-checked``, ``bidi-suppression``, ``example-inputs``,
  ``torchrun-env``, ``gitlab-failures``: silent passes and crashes, benchmarks.fuzz.attack_crashes.
"""
from __future__ import annotations

import collections
import hashlib
import json
import os
import random
import stat
from dataclasses import dataclass, field, replace
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks.fuzz.attack_api import VARIANTS as API_VARIANTS
from benchmarks.fuzz.attack_oracle import CONTROL, LimitedRun, judge_attack, run_limited
from benchmarks.fuzz.oracle import Checked

SOURCE_TIMEOUT = 60.0  # seconds of wall clock for a --source-only run
GRAPH_TIMEOUT = 150.0  # for a run that imports torch and the model (a tiny one: seconds, on a busy machine a minute)
HANG_TIMEOUT = 20.0  # where the attack is a hang (a FIFO), the extra seconds past a run's usual time
MEMORY_MB = 2048
FORMATS = ("full", "concise", "github", "json", "sarif", "rdjson", "html")

# hostile names; each holds its marker INJnn (nn: its index) so that the oracle can find it
PAYLOADS = (
    "a\n::error::INJ00", "a\n::stop-commands::INJ01", "a\r::warning::INJ02", "a\n::error title=preclint::INJ03",
    "a\n##[error]INJ04", "a\n  ::notice::INJ05", "a\x85::error::INJ06", "\x1b[31mINJ07\x1b[0m",
    "\x1b]8;;https://evil/INJ08\x07x\x1b]8;;\x07", "\x1b]0;INJ09\x07", "\x9b31mINJ10", "x\u202eINJ11",
    "x\u2067INJ12\u2069", "x\x7f\x08INJ13", "[/]INJ14", "[bold]INJ15[/bold]", "[link=https://evil/INJ16]x[/link]",
    "[md](https://evil/INJ17)", ":smile:INJ18", '<a href="https://evil/INJ19">x</a>', "<script>INJ20()</script>",
    "<img src=x onerror=INJ21()>", "a%0A::error::INJ22", "a,line=1:INJ23", "a b#c?INJ24", "\u00fc\u20acINJ25",
)


def marker(index: int) -> str:
    return f"INJ{index:02d}"


def printable(payload: str) -> bool:
    """Printed as written in full and concise output: no control, no line break, no space to wrap at."""
    return not CONTROL.search(payload) and "\n" not in payload and "\r" not in payload and " " not in payload


# ------------------------------------------------------------------------------------ the case

CLASSES: Dict[str, Tuple[int, Tuple[str, ...]]] = {  # class -> (weight, variants)
    "names": (4, ("module", "model-file", "source-files", "source-dir", "exception")),
    "cache-link": (1, ("link-file", "link-fifo", "link-dir", "link-top", "fifo", "deep-json")),
    "cache-edit": (1, ("severity", "invent", "hide", "message", "location", "directive", "types")),
    "checkpoint": (2, ("deflate", "deflate-data", "restored", "bomb", "truncated", "lying-size", "code",
                       "safetensors", "safetensors-offsets", "safetensors-header", "safetensors-dtype")),
    "special-file": (1, ("baseline-fifo", "baseline-zero", "baseline-deep", "baseline-dir", "config-fifo",
                         "config-zero", "config-flag-zero", "config-deep")),
    "exclude": (1, ("**", "*.py", "proj/**", "proj", "proj/", "s.py", "proj/s.py", "**/*.py")),
    "slow-growth": (1, ("reassign", "call", "chain", "function", "method")),
    "fork": (1, ("import-fork", "forward-fork", "popen", "multiprocessing", "daemon")),
    "nondeterministic": (1, ("rand", "dropout", "counter", "bernoulli")),
    "output-clash": (1, ("o-baseline", "o-config", "o-config-flag", "o-source", "o-model", "o-weights", "o-fifo",
                         "o-link")),
    "fix-unwritable": (1, ("first", "middle", "last")),
    "answers": (1, ("diff-nan", "diff-inf", "diff-negvar", "diff-overflow", "huge", "amax-epsilon", "complex",
                    "fraction", "range")),
    "api-state": (1, API_VARIANTS),
    # silent passes and crashes (benchmarks.fuzz.attack_crashes)
    "stdout-encoding": (1, ("cp1252", "ascii")),
    "lone-surrogate": (1, ("module", "file-bytes", "baseline")),
    "nothing-checked": (1, ("empty-dir", "exclude-all", "excluded-dir", "gitignore-all", "fifo", "force-excluded")),
    "bidi-suppression": (1, ("after", "before", "string")),
    "example-inputs": (1, ("deep", "holds-itself", "dict-holds-itself", "expand", "expand-keyword", "doubling",
                           "wide")),
    "torchrun-env": (1, ("world-only", "local-rank-x", "rank-x", "rank-out", "world-x", "world-0", "no-master")),
    "gitlab-failures": (1, ("three-models", "one-twice")),
}


@dataclass
class AttackCase:
    name: str
    attack: str  # the class
    variant: str
    params: Dict[str, object] = field(default_factory=dict)
    tags: List[str] = field(default_factory=list)


def attack_case(seed: int) -> AttackCase:
    """The case of ``seed``: only draws (cheap); the files are made when it is checked."""
    rng = random.Random(f"attack-{seed}")
    names = sorted(CLASSES)
    attack = rng.choices(names, [CLASSES[n][0] for n in names])[0]
    variant = rng.choice(CLASSES[attack][1])
    params: Dict[str, object] = {"seed": seed}
    if attack == "names":
        allowed = [i for i, p in enumerate(PAYLOADS) if variant in ("module", "exception") or "/" not in p]
        params["format"] = rng.choice(FORMATS)
        params["payloads"] = rng.sample(allowed, 1 if variant == "model-file" else rng.randint(3, 6))
    elif attack in ("cache-link", "special-file", "output-clash"):
        params["format"] = rng.choice(("concise", "json", "full"))
        params["graph"] = attack == "special-file" and rng.random() < 0.25
    elif attack == "exclude":
        params["graph"] = rng.random() < 0.3
    elif attack == "slow-growth":
        params["n"] = rng.choice((150, 200))
    elif attack == "fix-unwritable":
        params["directory"] = rng.random() < 0.5
    elif attack == "nondeterministic":
        params["noise"] = rng.choice((1e-2, 1e-4))
        params["format"] = rng.choice(("full", "concise", "json"))
        params["command"] = rng.choice(("check", "probe"))
    elif attack == "cache-edit":
        params["format"] = rng.choice(("full", "concise", "github")) if variant == "message" else "json"
    elif attack == "checkpoint":
        params["scale"] = rng.choice((1.0, 300.0))
    elif attack == "answers":
        from benchmarks.fuzz.attack_answers import params as answer_params

        params.update(answer_params(rng, variant))
    elif attack == "api-state":
        params["where"] = rng.choice(("import", "forward"))
        params["thread"] = rng.random() < 0.5
        params["precision"] = rng.choice(("high", "medium"))
        params["preload"] = rng.random() < 0.25  # torch._dynamo.config loaded before the call, or not
    elif attack in ("stdout-encoding", "lone-surrogate", "nothing-checked"):
        from benchmarks.fuzz.attack_crashes import ALL_FORMATS, NARROW_NAMES, SURROGATES

        params["format"] = rng.choice(ALL_FORMATS if attack != "nothing-checked" else ("full", "json", "sarif"))
        if attack == "lone-surrogate" and params["format"] == "html":
            params["format"] = "junit"  # (a page needs --output; the documents on stdout are what is judged)
        if attack == "stdout-encoding":
            params["names"] = rng.sample(range(len(NARROW_NAMES)), rng.randint(1, 4))
        elif attack == "lone-surrogate":
            params["names"] = rng.sample(range(len(SURROGATES)), rng.randint(1, 3))
    elif attack == "bidi-suppression":
        from benchmarks.fuzz.attack_crashes import BIDI, DIRECTIVES

        params["control"] = rng.randrange(len(BIDI))
        params["directive"] = rng.randrange(len(DIRECTIVES))
    tags = [f"attack:{attack}", f"variant:{attack}/{variant}"]
    if "format" in params:
        tags.append(f"format:{params['format']}")
    return AttackCase(f"attack-{seed}", attack, variant, params, tags)


def check_attack_case(case: AttackCase, directory: str) -> Checked:
    from benchmarks.fuzz import attack_answers, attack_api, attack_crashes, attack_files, attack_models

    runners: Dict[str, Callable[[AttackCase, str], Checked]] = {
        **attack_crashes.RUNNERS,
        "names": _names, "cache-link": attack_files.cache_link, "cache-edit": attack_files.cache_edit,
        "special-file": attack_files.special_file, "exclude": attack_files.exclude,
        "slow-growth": attack_files.slow_growth, "output-clash": attack_files.output_clash,
        "fix-unwritable": attack_files.fix_unwritable, "checkpoint": attack_models.checkpoint,
        "fork": attack_models.fork, "nondeterministic": attack_models.nondeterministic,
        "answers": attack_answers.answers,
        "api-state": attack_api.api_state,
    }
    checked = runners[case.attack](case, directory)
    verdict = checked.verdict
    if not verdict.ok:
        shown_format = case.attack in ("names", "stdout-encoding", "lone-surrogate")
        where = f"{case.attack}/{case.variant}" + (f" [{case.params['format']}]" if shown_format else "")
        checked.verdict = replace(verdict, signature=f"{verdict.failure}: {where}")
    return checked


# ------------------------------------------------------------------------------------ helpers

SOURCE_FINDING = "import torch\n\n\ndef test_close(a, b):\n    torch.testing.assert_allclose(a, b)\n"  # PCL503
SOURCE_MORE = "\n\ndef test_more(a, b):\n    torch.testing.assert_allclose(b, a)\n"
FIXABLE = "import torch\n\n\ndef forward(x):\n    with torch.cuda.amp.autocast():\n        return x\n"  # PCL502


def write(directory: str, rel: str, text: str) -> str:
    path = os.path.join(directory, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    return path


def digest(path: str) -> str:
    """What a path is: its type and, for a regular file, the sha256 of its bytes (a directory: of what
    it holds); "missing" when there is nothing."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(info.st_mode):
        return "link:" + os.readlink(path)
    if stat.S_ISDIR(info.st_mode):
        return "dir:" + ",".join(f"{n}={digest(os.path.join(path, n))}" for n in sorted(os.listdir(path)))
    if not stat.S_ISREG(info.st_mode):
        return f"special:{stat.S_IFMT(info.st_mode):o}"
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def findings_of(stdout: str) -> Optional[List[tuple]]:
    """The findings of a json report (several models: all of them), as comparable tuples."""
    try:
        doc = json.loads(stdout)
    except ValueError:
        return None
    out = []
    for report in doc if isinstance(doc, list) else [doc]:
        for f in report.get("findings", []) if isinstance(report, dict) else []:
            loc = f.get("location") or {}
            out.append((f.get("code"), f.get("severity"), f.get("module"), loc.get("path"), loc.get("line"),
                        loc.get("column"), f.get("message")))
    return sorted(out, key=repr)


def cache_env(directory: str) -> Dict[str, str]:
    return {"PRECLINT_CACHE_DIR": os.path.join(directory, "cache")}


def source_or_graph(case: AttackCase, directory: str) -> List[str]:
    """The target of a case that checks one file: proj/s.py (--source-only) or m.py (the graph)."""
    if case.params.get("graph"):
        from benchmarks.fuzz.attack_models import plain_model

        write(directory, "m.py", plain_model())
        return ["check", "m.py"]
    write(directory, "proj/s.py", SOURCE_FINDING)
    return ["check", "--source-only", "proj/s.py"]


def run(argv: Sequence[str], directory: str, env: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None, end_group: bool = True) -> LimitedRun:
    if timeout is None:
        timeout = SOURCE_TIMEOUT if "--source-only" in argv else GRAPH_TIMEOUT
    return run_limited(argv, directory, timeout=timeout, memory_mb=MEMORY_MB,
                       env={**cache_env(directory), **(env or {})}, end_group=end_group)


# ------------------------------------------------------------------------------------ names


def names_model(payloads: Sequence[str]) -> str:
    return ("import torch\nfrom torch import nn\n\nNAMES = " + repr(list(payloads)) + "\n\n\n"
            "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.blocks = nn.ModuleDict({n: nn.Linear(4, 4) for n in NAMES})\n\n"
            "    def forward(self, x):\n        return [b(x * 1e5) for b in self.blocks.values()]\n\n\n"
            "model = Net()\nexample_inputs = (torch.randn(2, 4),)\n")


def _names(case: AttackCase, directory: str) -> Checked:
    fmt = str(case.params["format"])
    chosen = [int(i) for i in case.params["payloads"]]  # type: ignore[union-attr]
    payloads = [PAYLOADS[i] for i in chosen]
    expected = {0, 1}
    if case.variant == "module":
        write(directory, "m.py", names_model(payloads))
        argv = ["check", "m.py"]
    elif case.variant == "model-file":
        from benchmarks.fuzz.attack_models import plain_model

        write(directory, payloads[0] + ".py", plain_model())
        argv = ["check", payloads[0] + ".py"]
    elif case.variant == "exception":
        write(directory, "m.py", f"raise ValueError({' '.join(payloads)!r})\n")
        argv, expected = ["check", "m.py"], {2}
    elif case.variant == "source-files":  # twelve findings: two past GitHub's ten
        for k in range(12):
            write(directory, f"proj/s{k:02d}_{payloads[k % len(payloads)]}.py", SOURCE_FINDING)
        argv = ["check", "--source-only", "proj"]
    else:  # source-dir
        for k, payload in enumerate(payloads):
            write(directory, f"proj/{payload}/t{k}.py", SOURCE_FINDING)
        argv = ["check", "--source-only", "proj"]
    argv += ["--output-format", fmt] + (["-o", "report.html"] if fmt == "html" else [])
    result = run(argv, directory)
    html = None
    if fmt == "html" and os.path.isfile(os.path.join(directory, "report.html")):
        with open(os.path.join(directory, "report.html"), encoding="utf-8", errors="replace") as f:
            html = f.read()
    markup = [(PAYLOADS[i], marker(i)) for i in chosen if printable(PAYLOADS[i])]
    verdict = judge_attack(result, argv, expected, payloads=payloads, markup=markup, html=html,
                           markers=[marker(i) for i in chosen])
    return Checked(verdict, result)


# ------------------------------------------------------------------------------------ the summary


def attack_summary(entries: Sequence[Dict[str, object]]) -> Dict[str, Dict[str, object]]:
    """Per class of attack (the ``attack:`` tag of the latest result of each case): tries, failures,
    and failures per signature."""
    out: Dict[str, Dict[str, object]] = {}
    for entry in entries:
        attack = next((str(t).split(":", 1)[1] for t in entry.get("tags", []) if str(t).startswith("attack:")), None)
        if attack is None:
            continue
        c = out.setdefault(attack, {"tries": 0, "failures": 0, "signatures": collections.Counter(), "examples": {}})
        c["tries"] = int(c["tries"]) + 1  # type: ignore[call-overload]
        if entry.get("failure"):
            c["failures"] = int(c["failures"]) + 1  # type: ignore[call-overload]
            sig = str(entry.get("signature"))
            c["signatures"][sig] += 1  # type: ignore[index]
            c["examples"].setdefault(sig, {"case": entry["case"], "detail": entry.get("detail")})  # type: ignore[union-attr]
    for c in out.values():
        c["signatures"] = dict(sorted(c["signatures"].items(), key=lambda kv: (-kv[1], kv[0])))  # type: ignore[union-attr]
    return dict(sorted(out.items()))
