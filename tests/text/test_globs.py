"""Glob matching in linear time (.gitignore, ``exclude``, ``per-file-ignores``): a pattern a checkout
commits cannot stall a run, and the patterns match what they always matched."""
from __future__ import annotations

import random
import re
import time
import warnings

import pytest

from preclint.config import check_glob
from preclint.core.errors import UserError
from preclint.text.discover import PatternFile, discover
from preclint.text.globs import GlobSet, full_match
from preclint.text.paths import glob_match

PATHOLOGICAL = ["*a*a*a*a*a*a*a*a*a*a*a*a*b", "**a**a**a**a**a**a**a**a**a**a**b", "*?*?*?*?*?*?*?*?*?*?*?*b",
                "**/**/**/**/**/**/**/**/**/**/b", "[a]*[a]*[a]*[a]*[a]*[a]*[a]*[a]*[a]*[a]*b"]


def old_regex(pattern: str) -> "re.Pattern[str]":
    """The translation preclint matched with before (a backtracking regex): the reference semantics."""
    out = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and pattern.find("]", i + 1) >= 0:
            end = pattern.find("]", i + 1)
            body = pattern[i + 1:end]
            out.append("[" + ("^" + body[1:] if body.startswith("!") else body) + "]")
            i = end + 1
        else:
            out.append(re.escape(c))
            i += 1
    return re.compile("".join(out) + r"\Z")


@pytest.mark.parametrize("pattern", PATHOLOGICAL)
def test_pathological_patterns_match_in_linear_time(pattern):
    names = ["a" * 40, "a" * 4000, "a/" * 2000 + "c", "x" + "a" * 4000 + "/"]
    started = time.process_time()
    for name in names:
        assert not full_match(pattern, name)
        glob_match(pattern, name)
    assert full_match(pattern, "a" * 12 + "b") or "/" in pattern
    assert time.process_time() - started < 2.0


def test_a_gitignore_of_a_pathological_pattern_does_not_stall_the_walk(tmp_path, monkeypatch):
    """As a checkout meets it: the pattern in a committed .gitignore, a 40-character file name."""
    (tmp_path / ".gitignore").write_text("\n".join(PATHOLOGICAL) + "\n")
    (tmp_path / ("a" * 40 + ".py")).write_text("x = 1\n")
    (tmp_path / ("a" * 12 + "b")).mkdir()
    (tmp_path / ("a" * 12 + "b") / "ignored.py").write_text("x = 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    started = time.process_time()
    assert discover(["."]) == ["a" * 40 + ".py"]
    assert discover(["."], exclude=PATHOLOGICAL) == ["a" * 40 + ".py"]
    assert time.process_time() - started < 2.0


def _random_pattern(rng: random.Random) -> str:
    pieces = ["a", "b", "/", "*", "**", "**/", "?", "[ab]", "[!a]", "[a-b]", ".", "[/]", "[", "]"]
    return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 7)))


def _random_name(rng: random.Random) -> str:
    return "".join(rng.choice("ab/.c[]") for _ in range(rng.randint(0, 9)))


@pytest.mark.slow
def test_patterns_match_what_the_backtracking_regex_matched():
    """The same answers as before on random patterns and names, whole names and path prefixes."""
    rng = random.Random(38)
    checked = 0
    for _ in range(3000):
        pattern = _random_pattern(rng)
        if pattern.count("*") > 6 or "[]" in pattern or "[!]" in pattern:
            continue  # the reference would take too long; an empty class made a regex of another meaning
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)  # "possible nested set": `[` in a class
                regex = old_regex(pattern)
        except re.error:
            continue  # a pattern the old matcher could not compile
        names = [_random_name(rng) for _ in range(20)]
        together = GlobSet([pattern, "b*", pattern])
        for name in names:
            expected = bool(regex.match(name))
            assert full_match(pattern, name) is expected, (pattern, name)
            assert (0 in together.matching(name)) is expected and (2 in together.matching(name)) is expected
            checked += 1
    assert checked > 50_000


def test_pattern_sets_report_each_pattern_that_matches():
    globs = GlobSet(["*.py", "a*", "**/b/*", "[!x]*", "c"])
    assert globs.matching("a.py") == [0, 1, 3]
    assert globs.matching("d/b/a.py") == [2]  # `*` and `[!x]*` stay within a name
    assert globs.matching("x") == []
    assert globs.matching_leading("c/b/e") == [2, 3, 4]  # "c/b/e", "c" and "c"


def test_last_matching_pattern_of_an_ignore_file_decides_across_kinds(tmp_path):
    patterns = PatternFile(str(tmp_path), "*.py\n!keep*.py\nsub/keep_not.py\nbuild/\n!build\n")
    assert patterns.match(str(tmp_path / "x.py"), False) is True
    assert patterns.match(str(tmp_path / "keep_a.py"), False) is False
    assert patterns.match(str(tmp_path / "sub" / "keep_not.py"), False) is True
    assert patterns.match(str(tmp_path / "build"), True) is False
    assert patterns.match(str(tmp_path / "notes.txt"), False) is None


def test_a_backward_range_is_one_clear_error_in_the_configuration_and_skipped_in_gitignore(tmp_path):
    with pytest.raises(UserError, match=r"invalid glob '\[z-a\]\.py': bad character range z-a"):
        check_glob("[z-a].py", "pyproject.toml: exclude")
    patterns = PatternFile(str(tmp_path), "[z-a].py\n*.py\n")
    assert patterns.match(str(tmp_path / "x.py"), False) is True
