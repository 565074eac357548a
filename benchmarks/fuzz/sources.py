"""Mutated Python files for ``preclint check --source-only``, ``--fix`` and ``--diff``.

A case starts from a real file (preclint's own, or the installed torch and numpy test files), often
with a source rule's own examples spliced in (so that rules fire and fixes are made), and applies one
to three mutations: deep nesting, huge expressions, long lines, many lines, encodings (coding
cookies, BOMs, UTF-16, invalid UTF-8, NUL bytes), truncation at a random byte, token deletions and
insertions, line endings, tabs and form feeds, unicode identifiers and separators, suppression
comments in odd places, whole-file oddities.

Each case is checked in process with ``preclint.source.run.check_file`` or through the command line
(``preclint.cli.main``, some runs with ``--fix`` or ``--diff``), and judged by the oracle plus the
fix's own properties: a file that compiled still compiles after ``--fix``, keeps its encoding, BOM
and line endings; ``--diff`` writes nothing; no file that was not given (or had nothing to fix) is
touched; a second ``--fix`` changes nothing more.
"""
from __future__ import annotations

import collections
import functools
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from benchmarks.fuzz.oracle import ROOT, Checked, Verdict, judge, run_in_process, snapshot, write_case_files

KEYWORDS = ("def", "class", "(", ")", ":", "lambda", "yield", "await", "async", "**", "@", "=", ",", '"', "'''", "\\",
            "#", "match", "case", ":=", "->", "...", "print", "torch", "amp", "allow_tf32", "assert_allclose", "1e-8",
            "[", "]", "{", "}", "if", "else", "\n", "\t", "    ", "return", "import", "from", "torch.cuda.amp", ";",
            "global", "nonlocal", "del", "not", "in", "f'{", "b'", "r'", "0x", "1_000", "_", "__", "\x0c")

UNICODE_NAMES = ("ｔｏｒｃｈ", "𝔱𝔬𝔯𝔠𝔥", "ﬁx", "é", "e\u0301", "π", "变量", "ΑΒΓ", "x\u200d", "ℌ", "ǅ", "ｉｍｐｏｒｔ")
ODD_CHARS = ("\u2028", "\u2029", "\u0085", "\u200b", "\u202e", "\ufeff", "\x0c", "\x0b", "\x1c", "\x1d", "\x1e")
SUPPRESSIONS = ("# preclint: ignore[PCL502]", "# noqa: PCL5", "# noqa", "# preclint: ignore[", "# preclint: ignore[PCL999, , ]",
                "# preclint:ignore", "#noqa:PCL502,PCL503", "# preclint: ignore[PCL501] # noqa: PCL504",
                "# preclint: ignore[ALL]", "# NOQA:pcl502", "# preclint: ignore[PCL5]", "# preclint: ignore[PCL502")
COOKIES = ("latin-1", "iso-8859-15", "cp1252", "utf-8-sig", "euc-jp", "shift_jis", "gb18030", "klingon", "utf-16",
           "ascii", "utf8", "big5", "cp037", "rot13", "UTF-8", "latin1")
MODERN = (
    "match x:\n    case [a, *rest]:\n        pass\n    case {'k': v}:\n        pass\n    case _:\n        pass\n",
    "async def f():\n    async with a as b:\n        await b\n    async for i in c:\n        yield i\n",
    "if (n := len(a)) > 10:\n    pass\n", "def f[T](x: T) -> T:\n    return x\n", "type X = int\n",
    "print(f'{x!r:>{width}} {f\"{y}\"}')\n", "def g(a, /, b, *, c):\n    return a\n",
    "try:\n    pass\nexcept* ValueError:\n    pass\n", "x = lambda: (yield)\n", "@(lambda f: f)\ndef h(): pass\n",
    "with (open(a) as f, open(b) as g):\n    pass\n", "x: 'torch.Tensor' = ...\n", "del (a), [b]\n",
    "class C(metaclass=type, **kw): pass\n", "print(*a, **b, sep='')\n", "x = 1 if y else 2 if z else 3\n",
    "assert (x, 'message')\n", "global q\n", "return 1\n", "break\n", "await x\n", "nonlocal y\n",
)


@dataclass
class SourceCase:
    name: str
    data: bytes  # the mutated file
    mutations: List[str]
    mode: str  # "api" (check_file), "cli", "fix", "diff", "many" (a directory of mutated files)
    argv: List[str] = field(default_factory=list)
    extra: Dict[str, bytes] = field(default_factory=dict)  # more files (relative path -> bytes)
    tags: List[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------ corpus

def own_files() -> List[Path]:
    """preclint's own Python files: the corpus the test suite uses (it ships with the code)."""
    files = []
    for folder in ("preclint", "tests", "benchmarks", "examples"):
        files += sorted((ROOT / folder).rglob("*.py"))
    return [f for f in files if f.stat().st_size < 120_000]


def installed_test_files(limit_bytes: int = 300_000) -> List[Path]:
    """The installed torch and numpy test files (and torch's testing helpers)."""
    files: List[Path] = []
    for package in ("torch", "numpy"):
        try:
            module = __import__(package)
        except ImportError:
            continue
        base = Path(module.__file__).parent
        for path in sorted(base.rglob("*.py")):
            parts = set(path.parts)
            if ("tests" in parts or "testing" in parts or path.name.startswith("test_")) and path.stat().st_size < limit_bytes:
                files.append(path)
    return files


@functools.lru_cache(maxsize=None)
def rule_snippets() -> Tuple[str, ...]:
    """Every source rule's valid and invalid examples: text that makes rules fire and fixes happen."""
    from preclint.rules import source_rules

    snippets: List[str] = []
    for rule in source_rules():
        snippets += [s for s in list(getattr(rule, "invalid", ())) + list(getattr(rule, "valid", ())) if s.strip()]
        if getattr(rule, "example", "").strip():
            snippets.append(rule.example)
    return tuple(snippets)


# ------------------------------------------------------------------------------------ mutations

def _top_level_lines(text: str) -> List[int]:
    """Line indices where a top-level statement may be inserted (before a line at column 0)."""
    lines = text.split("\n")
    spots = [i for i, line in enumerate(lines) if line[:1] not in (" ", "\t", ")", "]", "}", "") and not line.startswith(("else", "elif", "except", "finally", "@"))]
    return spots + [len(lines)]


def _insert_top(rng: random.Random, text: str, snippet: str) -> str:
    lines = text.split("\n")
    at = rng.choice(_top_level_lines(text))
    return "\n".join(lines[:at] + snippet.rstrip("\n").split("\n") + lines[at:])


def splice_rules(rng: random.Random, text: str) -> str:
    snippets = rule_snippets()
    for _ in range(rng.randint(1, 3)):
        text = _insert_top(rng, text, rng.choice(snippets))
    return text


def deep_nesting(rng: random.Random, text: str) -> str:
    n = rng.choice([30, 99, 100, 101, 199, 200, 201, 500, 1000, 5000, 30000])
    forms = [
        "x = " + "(" * n + "1" + ")" * n, "x = " + "[" * n + "]" * n, "x = " + "f(" * n + ")" * n,
        "x = " + "-" * n + "1", "x = " + "not " * n + "y", "x = " + "{'a': " * n + "1" + "}" * n,
        "x = " + "lambda: " * n + "0", "x = a" + ".b" * n, "x = " + "a[" * n + "0" + "]" * n,
        "x = " + "torch.cuda.amp.autocast(" * min(n, 300) + ")" * min(n, 300),
        "\n".join(" " * i + "if x:" for i in range(min(n, 120))) + "\n" + " " * min(n, 120) + "pass",
        "\n".join("    " * i + "def f():" for i in range(min(n, 120))) + "\n" + "    " * min(n, 120) + "return torch.cuda.amp.autocast()",
        "x = 1" + " if y else 1" * n, "x = " + "await " * n + "y", "x = " + "*" * n + "y",
        "x = f'" + "{" * min(n, 200) + "1" + "}" * min(n, 200) + "'",
    ]
    return _insert_top(rng, text, rng.choice(forms))


def huge_expression(rng: random.Random, text: str) -> str:
    n = rng.choice([1000, 10000, 100000])
    forms = [
        "x = " + " + ".join(["1"] * n), "x = '" + "a" * (n * 10) + "'", "x = [" + "1, " * n + "]",
        "f(" + "1, " * n + ")", "x = a" + " < b" * n, "x = (" + " ".join(["'s'"] * n) + ")",
        "x = {" + ", ".join(f"{i}: {i}" for i in range(n)) + "}", "torch.testing.assert_allclose(a, b" + ", c" * n + ")",
        "x = " + " + ".join(["torch.tensor(1e-8)"] * (n // 10)),
    ]
    return _insert_top(rng, text, rng.choice(forms))


def long_line(rng: random.Random, text: str) -> str:
    n = rng.choice([10_000, 200_000, 1_000_000])
    forms = ["# " + "x" * n, "x = 1;" * (n // 6), "s = '" + "\\" * 2 * (n // 2) + "'", "x = " + "1" * n]
    return _insert_top(rng, text, rng.choice(forms))


def many_lines(rng: random.Random, text: str) -> str:
    n = rng.choice([10_000, 100_000])
    return text + rng.choice(["\n" * n, "pass\n" * n, "#\n" * n, "x = 1\n" * (n // 2), "\\\n" * 100 + "x = 1\n"])


def truncate(rng: random.Random, data: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)] if data else data


_TOKEN = re.compile(r"\w+|\s+|.", re.S)


def tokens(rng: random.Random, text: str) -> str:
    parts = _TOKEN.findall(text)
    for _ in range(rng.randint(1, 8)):
        if not parts:
            break
        i = rng.randrange(len(parts))
        action = rng.randrange(4)
        if action == 0:
            del parts[i]
        elif action == 1:
            parts.insert(i, rng.choice(KEYWORDS))
        elif action == 2:
            parts.insert(i, parts[i])
        else:
            j = rng.randrange(len(parts))
            parts[i], parts[j] = parts[j], parts[i]
    return "".join(parts)


def line_endings(rng: random.Random, text: str) -> str:
    choice = rng.randrange(6)
    if choice == 0:
        return text.replace("\n", "\r\n")
    if choice == 1:
        return text.replace("\n", "\r")
    if choice == 2:
        return "".join(line + rng.choice(["\n", "\r\n", "\r"]) for line in text.split("\n"))
    if choice == 3:
        return text.rstrip("\n")
    if choice == 4:
        return text.rstrip("\n") + "\\"
    return text.replace("\n", "\r\n").rstrip("\r\n") + "\r"


def indentation(rng: random.Random, text: str) -> str:
    choice = rng.randrange(5)
    lines = text.split("\n")
    if choice == 0:
        return "\n".join(re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), line) for line in lines)
    if choice == 1:
        return "\n".join(re.sub(r"^    ", "\t", line) if rng.random() < 0.3 else line for line in lines)
    if choice == 2:
        return "\n".join(("\x0c" + line) if rng.random() < 0.2 else line for line in lines)
    if choice == 3:
        return "\n".join(line + rng.choice([" ", "\t", "  \t "]) if rng.random() < 0.3 else line for line in lines)
    return "\n".join(line.replace("    ", "  \t", 1) if rng.random() < 0.2 else line for line in lines)


def unicode(rng: random.Random, text: str) -> str:
    choice = rng.randrange(3)
    if choice == 0:
        names = sorted(set(re.findall(r"\b[A-Za-z_]\w*\b", text)))
        if names:
            old = rng.choice(names)
            return re.sub(rf"\b{re.escape(old)}\b", rng.choice(UNICODE_NAMES), text)
        return text
    if choice == 1:
        return text.replace("torch", rng.choice(["ｔｏｒｃｈ", "𝔱𝔬𝔯𝔠𝔥", "torch"]), rng.randint(1, 5))
    chars = list(text)
    for _ in range(rng.randint(1, 5)):
        chars.insert(rng.randrange(len(chars) + 1), rng.choice(ODD_CHARS))
    return "".join(chars)


def suppressions(rng: random.Random, text: str) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(lines))
        comment = rng.choice(SUPPRESSIONS)
        lines[i] = lines[i] + rng.choice(["  ", " ", "\t", ""]) + comment if rng.random() < 0.8 else comment
    return "\n".join(lines)


def modern_syntax(rng: random.Random, text: str) -> str:
    return _insert_top(rng, text, rng.choice(MODERN))


def whole_file(rng: random.Random, text: str) -> str:
    return rng.choice(["", "\n", "\\", "#", "# coding: latin-1", "pass", "'''", "(", "\x0c", " \n x = 1",
                       "if x:\n", "x = 1\n" * 3 + "\t", text + text, "\n".join(reversed(text.split("\n"))),
                       "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n"])


def encoding(rng: random.Random, text: str) -> bytes:
    choice = rng.randrange(11)
    if choice == 0:  # a latin-1 cookie and text that needs it
        body = text.replace("the", "thé", 3)
        return ("# -*- coding: latin-1 -*-\n" + body).encode("latin-1", "replace")
    if choice == 1:
        return b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass")
    if choice == 2:  # a BOM and a cookie that disagrees
        return b"\xef\xbb\xbf# coding: latin-1\n" + text.encode("utf-8", "surrogatepass")
    if choice == 3:
        return text.encode(rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32"]), "surrogatepass")
    if choice == 4:  # invalid UTF-8
        data = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data) + 1):0] = rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xe2\x82", b"\x80"])
        return bytes(data)
    if choice == 5:  # NUL bytes
        data = bytearray(text.encode("utf-8", "surrogatepass"))
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data) + 1):0] = b"\x00"
        return bytes(data)
    if choice == 6:  # a cookie of any kind, on line 1 or 2 (after a shebang) or too late (line 3)
        cookie = f"# -*- coding: {rng.choice(COOKIES)} -*-\n"
        where = rng.randrange(3)
        head = ["", "#!/usr/bin/env python\n", "#!/usr/bin/env python\n\n"][where]
        try:
            return (head + cookie + text).encode(cookie.split()[2], "replace")
        except (LookupError, UnicodeError):
            return (head + cookie + text).encode("utf-8", "surrogatepass")
    if choice == 7:  # CJK text under a multibyte codec: bytes that look like quotes and backslashes
        codec = rng.choice(["shift_jis", "big5", "gb18030", "euc-jp"])
        body = _insert_top(rng, text, "s = '表ソ能十予'  # 表示")
        return (f"# coding: {codec}\n" + body).encode(codec, "replace")
    if choice == 8:
        return b"\xef\xbb\xbf" + b"\xef\xbb\xbf" + text.encode("utf-8", "surrogatepass")  # two BOMs
    if choice == 9:
        return text.encode("utf-8", "surrogatepass") + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64)))
    return bytes(rng.randrange(256) for _ in range(rng.choice([1, 100, 10000])))


TEXT_MUTATIONS: Dict[str, Callable[[random.Random, str], str]] = {
    "nesting": deep_nesting, "huge-expression": huge_expression, "long-line": long_line, "many-lines": many_lines,
    "tokens": tokens, "line-endings": line_endings, "indentation": indentation, "unicode": unicode,
    "suppressions": suppressions, "modern-syntax": modern_syntax, "whole-file": whole_file,
}
WEIGHTS = {"nesting": 3, "huge-expression": 1, "long-line": 1, "many-lines": 1, "tokens": 5, "line-endings": 3,
           "indentation": 3, "unicode": 3, "suppressions": 4, "modern-syntax": 2, "whole-file": 1,
           "encoding": 4, "truncate": 3}


def mutate(rng: random.Random, text: str) -> Tuple[bytes, List[str]]:
    """1-3 mutations of ``text``; the byte-level ones (encodings, truncation) come last."""
    names = list(WEIGHTS)
    chosen = rng.choices(names, [WEIGHTS[n] for n in names], k=rng.choice([1, 1, 2, 3]))
    chosen.sort(key=lambda n: n in ("encoding", "truncate"))
    data: Optional[bytes] = None
    for name in chosen:
        if name == "encoding":
            data = encoding(rng, text) if data is None else data
        elif name == "truncate":
            data = truncate(rng, data if data is not None else text.encode("utf-8", "surrogatepass"))
        else:
            text = TEXT_MUTATIONS[name](rng, text)
    return (data if data is not None else text.encode("utf-8", "surrogatepass")), chosen


# ------------------------------------------------------------------------------------ cases

FORMATS = ("full", "concise", "json", "sarif", "github", "rdjson")


def source_case(seed: int, corpus: Sequence[Path]) -> SourceCase:
    rng = random.Random(f"source-{seed}")
    base = rng.choice(corpus).read_text(encoding="utf-8", errors="surrogateescape")
    tags: List[str] = []
    if rng.random() < 0.6:
        base = splice_rules(rng, base)
        tags.append("rule-snippets")
    data, mutations = mutate(rng, base)
    mode = rng.choices(["api", "cli", "fix", "diff", "many"], [55, 17, 15, 8, 5])[0]
    case = SourceCase(f"source-{seed}", data, mutations, mode, tags=tags + [f"mutation:{m}" for m in mutations] + [f"mode:{mode}"])
    if mode == "api":
        return case
    fmt = rng.choice(FORMATS)
    argv = ["check", "--source-only", "--output-format", fmt]
    case.tags.append(f"format:{fmt}")
    if mode == "fix":
        argv.append("--fix")
    elif mode == "diff":
        argv.append("--diff")
    if mode in ("fix", "diff") and rng.random() < 0.3:
        argv.append("--unsafe-fixes")
    if rng.random() < 0.3:
        argv.append("--no-cache")
    if rng.random() < 0.15:
        argv += ["--select", rng.choice(["ALL", "PCL5", "PCL502,PCL599", "PCL500"])]
    if rng.random() < 0.1:
        argv.append("--exit-zero")
    # a second file given, and a file nobody gave (it must never change)
    case.extra["other/untouched.py"] = splice_rules(rng, "import torch\n").encode()
    if mode == "many":
        for i in range(rng.randint(4, 12)):
            more, _ = mutate(rng, splice_rules(rng, rng.choice(corpus).read_text(encoding="utf-8", errors="surrogateescape")))
            case.extra[f"proj/m{i}.py"] = more
        argv += ["proj"]
        case.tags.append("directory")
    else:
        argv += ["proj/target.py"]
        if rng.random() < 0.3:
            case.extra["proj/second.py"] = splice_rules(rng, rng.choice(corpus).read_text(encoding="utf-8", errors="surrogateescape")).encode()
            argv.append("proj/second.py")
    case.argv = argv
    return case


# ------------------------------------------------------------------------------------ judging

def compiles(data: bytes) -> bool:
    try:
        compile(data, "<fuzz>", "exec", dont_inherit=True)
        return True
    except BaseException:  # noqa: BLE001 - SyntaxError, ValueError (NUL), RecursionError, MemoryError...
        return False


def _newlines(data: bytes) -> str:
    crlf = data.count(b"\r\n")
    lf = data.count(b"\n") - crlf
    cr = data.count(b"\r") - crlf
    kinds = [k for k, n in (("crlf", crlf), ("lf", lf), ("cr", cr)) if n]
    return kinds[0] if len(kinds) == 1 else "mixed" if kinds else "none"


def _encoding_of(data: bytes) -> Optional[str]:
    import io
    import tokenize

    try:
        return tokenize.detect_encoding(io.BytesIO(data).readline)[0]
    except (SyntaxError, LookupError):
        return None


def _comments(data: bytes) -> "collections.Counter[str]":
    """The comments of a file, counted (none when it does not tokenize)."""
    import io
    import tokenize

    try:
        return collections.Counter(t.string for t in tokenize.tokenize(io.BytesIO(data).readline)
                                   if t.type == tokenize.COMMENT)
    # (tokenize is the oracle's own, independent of preclint's scanner; Python 3.12's raises
    # SystemError on a NUL byte, where no comment can be judged either)
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, ValueError, SystemError):
        return collections.Counter()


def fix_problem(before: bytes, after: bytes) -> Optional[str]:
    """What a fix broke in a file: compiling, encoding, BOM, line endings."""
    if compiles(before) and not compiles(after):
        return "the fixed file no longer compiles"
    lost = _comments(before) - _comments(after)
    if lost:
        return f"the fix deleted a comment: {next(iter(lost))[:60]!r}"
    if before.startswith(b"\xef\xbb\xbf") != after.startswith(b"\xef\xbb\xbf"):
        return "the fix added or removed the BOM"
    if _encoding_of(before) != _encoding_of(after):
        return f"the fix changed the encoding from {_encoding_of(before)} to {_encoding_of(after)}"
    kind = _newlines(before)
    if kind in ("crlf", "lf", "cr") and _newlines(after) not in (kind, "none"):
        return f"the fix changed {kind} line endings to {_newlines(after)}"
    return None


def check_api(case: SourceCase, directory: str) -> Checked:
    """``check_file`` on the mutated file: no exception, every finding placed inside the file."""
    import traceback

    from preclint.source.run import check_file

    path = os.path.join(directory, "target.py")
    with open(path, "wb") as f:
        f.write(case.data)
    try:
        findings = check_file(path, path="target.py")
    except BaseException:  # noqa: BLE001
        text = traceback.format_exc()
        from benchmarks.fuzz.oracle import _innermost

        return Checked(Verdict("crash", text.strip().splitlines()[-1][:200], f"crash: check_file {_innermost(text)}"))
    from preclint.text.sourcefile import SourceFile

    try:
        lines = SourceFile.read(path, "target.py").text.splitlines() if findings else []
    except Exception:  # noqa: BLE001 - undecodable: PCL599 at 1:1 is all there can be
        lines = []
    for finding in findings:
        loc = finding.location
        if loc is None:
            continue
        if loc.path != "target.py" or loc.line < 1 or loc.column < 1 or (lines and loc.line > len(lines) + 1):
            return Checked(Verdict("invalid-location", f"{finding.code} at {loc.path}:{loc.line}:{loc.column} "
                                   f"(the file has {len(lines)} lines)", f"invalid-location: {finding.code}"))
    return Checked(Verdict(), extra={"findings": len(findings)})


def check_cli(case: SourceCase, directory: str) -> Checked:
    files = {"proj/target.py": case.data} if case.mode != "many" else {}
    files.update(case.extra)
    write_case_files(directory, {}, files)
    before = snapshot(directory)
    run = run_in_process(case.argv, directory)
    targets = 1
    verdict = judge(run, case.argv, valid=True, targets=targets)
    if not verdict.ok:
        return Checked(verdict, run)
    after = snapshot(directory)
    changed = sorted(name for name in before if after.get(name) != before[name])
    if case.mode != "fix":
        if changed:
            return Checked(Verdict("fix-touched", f"{changed[0]} changed without --fix", f"fix-touched: {case.mode}"), run)
        return Checked(verdict, run)
    given = {os.path.normpath(a) for a in case.argv if a.startswith("proj")}
    for name in changed:
        if not any(name == g or name.startswith(g + os.sep) for g in given):
            return Checked(Verdict("fix-touched", f"{name} changed although it was not given", "fix-touched: not given"), run)
        with open(os.path.join(directory, name), "rb") as f:
            now = f.read()
        problem = fix_problem(files[name], now)
        if problem:
            return Checked(Verdict("fix-broke", f"{name}: {problem}", f"fix-broke: {normalise_problem(problem)}"), run)
    if changed:  # a fixed file has nothing left to fix
        again = snapshot(directory)
        second = run_in_process(case.argv, directory)
        moved = sorted(name for name in again if snapshot(directory).get(name) != again[name])
        if second.rc not in (0, 1) or moved:
            return Checked(Verdict("fix-unstable", f"a second --fix changed {moved[:1] or second.rc}", "fix-unstable"), run)
    return Checked(verdict, run, extra={"fixed": len(changed)})


def normalise_problem(problem: str) -> str:
    return re.sub(r"from \S+ to \S+", "from A to B", problem.split(": '")[0])


def check_source_case(case: SourceCase, directory: str) -> Checked:
    if case.mode == "api":
        return check_api(case, directory)
    return check_cli(case, directory)
