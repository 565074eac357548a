"""Attack classes of silent passes and crashes (the issue "Trust, round 3"), for benchmarks.fuzz.attacks:

- ``stdout-encoding``: files named in CJK, emoji and accented letters, checked in every output format
  with stdout in cp1252 (what Windows gives a redirected stdout) or ASCII: exit 1, the documents valid
  UTF-8 that parses, the text formats in the stream's encoding with the names escaped;
- ``lone-surrogate``: a lone surrogate in module names (every format, and a baseline written and read
  back) or undecodable bytes in file names: no internal error, valid documents;
- ``nothing-checked``: runs that read no file (an empty directory, everything excluded by ``exclude``
  or .gitignore, a named FIFO): exit 2 with one line, nothing on stdout; named files that
  ``--force-exclude`` leaves out: exit 0 with the note;
- ``bidi-suppression``: a suppression on a line with a bidirectional control: the finding stays and
  the void suppression is reported (PCL500);
- ``example-inputs``: example inputs nested 100,000 deep, holding themselves, a 10**12-element
  ``expand`` view, 2**60 paths, 2,000,000 values: exit 2 with one line;
- ``torchrun-env``: a half-set torchrun environment: exit 2 with one line;
- ``gitlab-failures``: models of one file that all fail: distinct GitLab fingerprints.
"""
from __future__ import annotations

import json
import os
from xml.etree import ElementTree

from benchmarks.fuzz.attack_oracle import judge_attack
from benchmarks.fuzz.oracle import Checked, Verdict, document_problem, judge

ALL_FORMATS = ("full", "concise", "github", "json", "sarif", "rdjson", "gitlab", "junit", "html")
DOCUMENTS = ("json", "sarif", "rdjson", "gitlab", "junit", "html")
NARROW_NAMES = ("模型", "net_😀", "café", "ñandú_λ", "Ω≈ç√", "𝔘𝔫𝔦", "عربي", "한국어", "naïve_Ж", "🔥🔥")
SURROGATES = ("a\ud800b", "\udfff", "x\udc80y", "\ud83d", "m\udbff\udc00")  # (the last is a pair only in UTF-16)
BIDI = ("\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
        "\u200e", "\u200f", "\u061c")
DIRECTIVES = ("# preclint: ignore[PCL503]", "# preclint: ignore", "# noqa: PCL503", "# noqa")
SOURCE_FINDING = "import torch\n\n\ndef test_close(a, b):\n    torch.testing.assert_allclose(a, b)\n"  # PCL503, line 5

INPUT_MODEL = ("import torch\nfrom torch import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n"
               "        super().__init__()\n        self.fc = nn.Linear(8, 8)\n\n"
               "    def forward(self, x, *rest, **keywords):\n        return self.fc(torch.ones(2, 8))\n\n\n")
HOSTILE_INPUTS = {
    "deep": "v = torch.randn(2, 8)\nfor _ in range(100_000):\n    v = [v]\nexample_inputs = (v,)\n",
    "holds-itself": "v = [torch.randn(2, 8)]\nv.append(v)\nexample_inputs = (v,)\n",
    "dict-holds-itself": 'd = {"x": torch.randn(2, 8)}\nd["d"] = d\nexample_inputs = d\n',
    "expand": "example_inputs = (torch.zeros(1).expand(10**12),)\n",
    "expand-keyword": 'example_inputs = ((torch.randn(2, 8),), {"m": torch.zeros(1).expand(10**12)})\n',
    "doubling": "v = [torch.randn(2, 8)]\nfor _ in range(60):\n    v = [v, v]\nexample_inputs = (v,)\n",
    "wide": "example_inputs = ([[None] * 1000] * 2000,)\n",
}
ENVIRONMENTS = {
    "world-only": {"WORLD_SIZE": "2"},
    "local-rank-x": {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "x"},
    "rank-x": {"WORLD_SIZE": "2", "RANK": "x"},
    "rank-out": {"WORLD_SIZE": "2", "RANK": "7"},
    "world-x": {"WORLD_SIZE": "two"},
    "world-0": {"WORLD_SIZE": "0"},
    "no-master": {"WORLD_SIZE": "2", "RANK": "0"},
}
FAILING_MODELS = ("from torch import nn\n\n\n" + "".join(
    f"class M{k}(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
    f"        raise RuntimeError('model {k} cannot be built')\n\n\n" for k in range(3)))


def _write(directory: str, rel: str, text: str) -> str:
    from benchmarks.fuzz.attacks import write

    return write(directory, rel, text)


def _run(argv, directory, env=None, timeout=None):
    from benchmarks.fuzz.attacks import run

    return run(argv, directory, env=env, timeout=timeout)


def _fail(failure: str, detail: str, result) -> Checked:
    return Checked(Verdict(failure, detail), result)


def _document_problem(fmt: str, data: bytes):
    """Why ``data`` (stdout's bytes) is not a valid document of ``fmt`` in UTF-8; None when it is."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"{fmt} output is not UTF-8: {exc}"
    if fmt == "html":
        return None if text.lstrip().lower().startswith("<!doctype html") else "html output is no page"
    if fmt == "junit":
        try:
            ElementTree.fromstring(data)
        except ElementTree.ParseError as exc:
            return f"junit output does not parse: {exc}"
        return None
    return document_problem(fmt, text)


# ------------------------------------------------------------------------------------ classes


def stdout_encoding(case, directory: str) -> Checked:
    encoding, fmt = case.variant, str(case.params["format"])
    names = [NARROW_NAMES[int(i)] for i in case.params["names"]]  # type: ignore[union-attr]
    for k, name in enumerate(names):
        _write(directory, f"proj/{name}_{k}.py", SOURCE_FINDING)
    argv = ["check", "--source-only", "proj", "--output-format", fmt]
    result = _run(argv, directory, env={"PYTHONIOENCODING": encoding})
    verdict = judge_attack(result, argv, {1})
    if not verdict.ok:
        return Checked(verdict, result)
    if fmt in DOCUMENTS:
        problem = _document_problem(fmt, result.stdout_bytes)
        if problem:
            return _fail("invalid-document", problem, result)
        return Checked(Verdict(), result)
    try:
        text = result.stdout_bytes.decode(encoding)
    except UnicodeDecodeError as exc:
        return _fail("encoding", f"{fmt} output is not {encoding}: {exc}", result)
    if fmt != "full":  # (rich may wrap a long name in the full report)
        for k, name in enumerate(names):
            shown = f"{name}_{k}.py".encode(encoding, "backslashreplace").decode(encoding)
            if shown not in text:
                return _fail("name-lost", f"{shown!r} not in the {fmt} output", result)
    return Checked(Verdict(), result)


def _surrogate_model(names) -> str:
    return ("import torch\nfrom torch import nn\n\nNAMES = " + ascii(list(names)) + "\n\n\n"
            "class Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
            "        self.blocks = nn.ModuleDict({n: nn.Linear(4, 4) for n in NAMES})\n\n"
            "    def forward(self, x):\n        return [b(x * 1e5) for b in self.blocks.values()]\n\n\n"
            "model = Net()\nexample_inputs = (torch.randn(2, 4),)\n")


def lone_surrogate(case, directory: str) -> Checked:
    fmt = str(case.params["format"])
    if case.variant == "file-bytes":
        for k, raw in enumerate((b"s\xff", b"t\xfe\xfd", b"u\x80v")):
            _write(directory, os.fsdecode(b"proj/" + raw + b"%d.py" % k), SOURCE_FINDING)
        argv = ["check", "--source-only", "proj", "--output-format", fmt]
    else:
        names = [SURROGATES[int(i)] for i in case.params["names"]]  # type: ignore[union-attr]
        _write(directory, "m.py", _surrogate_model(names))
        argv = ["check", "m.py", "--output-format", fmt]
    if case.variant == "baseline":
        written = _run(["check", "m.py", "--write-baseline", "b.json", "-q"], directory)
        verdict = judge_attack(written, ["check", "m.py"], {0})
        if not verdict.ok:
            return Checked(verdict, written)
        argv += ["--baseline", "b.json"]
    result = _run(argv, directory)
    verdict = judge_attack(result, argv, {0} if case.variant == "baseline" else {1})
    if verdict.ok and fmt in DOCUMENTS:
        problem = _document_problem(fmt, result.stdout_bytes)
        if problem:
            verdict = Verdict("invalid-document", problem)
    return Checked(verdict, result)


def nothing_checked(case, directory: str) -> Checked:
    fmt = str(case.params["format"])
    _write(directory, "proj/s.py", SOURCE_FINDING)
    target, expected = ["proj"], 2
    if case.variant == "empty-dir":
        os.makedirs(os.path.join(directory, "empty"))
        target = ["empty"]
    elif case.variant == "exclude-all":
        _write(directory, "pyproject.toml", '[tool.preclint]\nexclude = ["*.py"]\n')
    elif case.variant == "excluded-dir":
        _write(directory, "pyproject.toml", '[tool.preclint]\nexclude = ["proj"]\n')
    elif case.variant == "gitignore-all":
        os.makedirs(os.path.join(directory, ".git"))
        _write(directory, ".gitignore", "*.py\n")
    elif case.variant == "fifo":
        os.mkfifo(os.path.join(directory, "pipe.py"))
        target = ["pipe.py"]
    else:  # force-excluded: pre-commit's hook naming an excluded staged file passes, with a note
        _write(directory, "pyproject.toml", '[tool.preclint]\nexclude = ["proj/"]\n')
        target, expected = ["--force-exclude", "proj/s.py"], 0
    argv = ["check", "--source-only", *target, "--output-format", fmt]
    result = _run(argv, directory, env={"GIT_CEILING_DIRECTORIES": os.path.dirname(directory)})
    if expected == 0:
        if result.rc != 0 or "1 named file excluded by the configuration" not in result.stderr:
            return _fail("exit-status", f"exit {result.rc}, expected 0 with the note: {result.stderr[-160:]!r}", result)
        return Checked(Verdict(), result)
    verdict = judge_attack(result, argv, {2})
    if verdict.ok and (result.stdout.strip() or "no Python file was checked" not in result.stderr):
        verdict = Verdict("silent-pass", f"stdout {result.stdout[:80]!r}, stderr {result.stderr[-160:]!r}")
    return Checked(verdict, result)


def bidi_suppression(case, directory: str) -> Checked:
    control = BIDI[int(case.params["control"])]  # type: ignore[arg-type]
    directive = DIRECTIVES[int(case.params["directive"])]  # type: ignore[arg-type]
    lines = SOURCE_FINDING.splitlines()
    if case.variant == "after":
        lines[4] += f"  {directive} {control}"
    elif case.variant == "before":
        lines[4] += f"  # {control} {directive}"
    else:  # in a string before the comment
        lines[4] = f'    s = "{control}"; torch.testing.assert_allclose(a, b)  {directive}'
    _write(directory, "proj/s.py", "\n".join(lines) + "\n")
    argv = ["check", "--source-only", "proj/s.py", "--output-format", "concise"]
    result = _run(argv, directory)
    verdict = judge_attack(result, argv, {1}, payloads=[control])
    if verdict.ok and ("PCL503" not in result.stdout or "PCL500 Suppression ignored" not in result.stdout):
        verdict = Verdict("honoured", f"the finding or the report of the void suppression is missing: {result.stdout[:200]!r}")
    return Checked(verdict, result)


def example_inputs(case, directory: str) -> Checked:
    _write(directory, "m.py", INPUT_MODEL + HOSTILE_INPUTS[case.variant])
    argv = ["check", "m.py", "--output-format", "concise"]
    result = _run(argv, directory)
    verdict = judge_attack(result, argv, {2})
    if verdict.ok and result.stderr.count("\n") != 1:
        verdict = Verdict("user-error", f"not one line: {result.stderr[-200:]!r}")
    return Checked(verdict, result)


def torchrun_env(case, directory: str) -> Checked:
    from benchmarks.fuzz.attack_models import plain_model

    _write(directory, "m.py", plain_model())
    argv = ["check", "m.py", "--probe", "cpu", "--output-format", "concise", "-q"]
    # (the fuzzer's own environment holds none of torchrun's variables: those the variant leaves out are unset)
    result = _run(argv, directory, env=ENVIRONMENTS[case.variant])
    verdict = judge_attack(result, argv, {2})
    if verdict.ok and "unset WORLD_SIZE" not in result.stderr:
        verdict = Verdict("user-error", f"no word on the environment: {result.stderr[-200:]!r}")
    return Checked(verdict, result)


def gitlab_failures(case, directory: str) -> Checked:
    _write(directory, "m.py", FAILING_MODELS)
    models = ["m.py:M0", "m.py:M1", "m.py:M2"] if case.variant == "three-models" else ["m.py:M1", "m.py:M0", "m.py:M1"]
    argv = ["check", *models, "--output-format", "gitlab", "-q"]
    result = _run(argv, directory)
    verdict = judge(result, argv, valid=False, targets=len(models))  # (an error line a model)
    if verdict.ok and result.rc != 2:
        verdict = Verdict("exit-status", f"exit {result.rc}, expected 2")
    if verdict.ok:
        problem = _document_problem("gitlab", result.stdout_bytes)
        if problem is None and len(json.loads(result.stdout)) != 3:
            problem = f"{len(json.loads(result.stdout))} issues for 3 models that failed"
        if problem:
            verdict = Verdict("invalid-document", problem)
    return Checked(verdict, result)


RUNNERS = {"stdout-encoding": stdout_encoding, "lone-surrogate": lone_surrogate, "nothing-checked": nothing_checked,
           "bidi-suppression": bidi_suppression, "example-inputs": example_inputs, "torchrun-env": torchrun_env,
           "gitlab-failures": gitlab_failures}
