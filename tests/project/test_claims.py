"""benchmarks/CLAIMS.md maps every quoted figure to a result file and a key in it. Every file it lists
exists, every file in benchmarks/results/ is listed, every key is in its file, and a figure written
as ``key = value`` is the file's value (every value the key reaches, where it reaches several)."""
from __future__ import annotations

import decimal
import json
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest
from tests.paths import ROOT

CLAIMS = ROOT / "benchmarks" / "CLAIMS.md"
RESULTS = "benchmarks/results"
RESULT_SUFFIXES = (".json", ".txt")
FIELDS = ("command", "commit", "machine", "date")

SECTION = re.compile(r"^## `([^`]+)`\s*$")
FIELD = re.compile(r"^- (\w+): (.+)$")
CODE = re.compile(r"`([^`]+)`")
# a key path: name, "quoted.name" (dots inside), [3], [*] (any item) or [field=value] (the item whose
# field is value), joined by dots
STEP = re.compile(r'\.?(?:"(?P<quoted>[^"]*)"|(?P<bare>[^.\[\]"\s]+))|\[(?P<index>[^\]]*)\]')


def sections(text: str) -> Dict[str, Dict[str, Any]]:
    """Each ``## `path` `` section: its fields (``- command: ...``) and its table rows (cells)."""
    found: Dict[str, Dict[str, Any]] = {}
    current: Optional[Dict[str, Any]] = None
    for line in text.splitlines():
        heading = SECTION.match(line)
        if heading:
            current = found.setdefault(heading.group(1), {"fields": {}, "rows": [], "repeated": False})
            current["repeated"] = current["repeated"] or bool(current["rows"] or current["fields"])
            continue
        if line.startswith("#"):
            current = None
            continue
        if current is None:
            continue
        field = FIELD.match(line)
        if field:
            current["fields"][field.group(1)] = field.group(2)
        elif line.startswith("|") and not re.match(r"^\|[\s|:-]+\|$", line):
            cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
            if cells[:2] != ["claim", "value"]:
                current["rows"].append(cells)
    return found


def resolve(document: Any, path: str) -> List[Any]:
    """The values ``path`` reaches in ``document`` (none when it does not resolve)."""
    values, position = [document], 0
    while position < len(path):
        step = STEP.match(path, position)
        if step is None or step.end() == position:
            raise ValueError(f"not a key path: {path!r} (at {path[position:]!r})")
        position = step.end()
        name = step.group("quoted") if step.group("quoted") is not None else step.group("bare")
        reached: List[Any] = []
        for value in values:
            if name is not None:
                if isinstance(value, dict) and name in value:
                    reached.append(value[name])
                continue
            index = step.group("index")
            items = list(value.values()) if isinstance(value, dict) else value if isinstance(value, list) else []
            if index == "*":
                reached.extend(items)
            elif "=" in index:
                field, wanted = index.split("=", 1)
                reached.extend(i for i in items if isinstance(i, dict) and str(i.get(field)) == wanted)
            elif isinstance(value, list) and re.fullmatch(r"-?\d+", index) and -len(value) <= int(index) < len(value):
                reached.append(value[int(index)])
        values = reached
    return values


def matches(value: Any, literal: str) -> bool:
    """Whether a value the file holds is the figure written: a number to the digits written (0.235
    matches 0.2347), anything else exactly."""
    try:
        expected = json.loads(literal)
    except json.JSONDecodeError:
        expected = literal
    if isinstance(expected, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        step = decimal.Decimal(literal.strip()).as_tuple().exponent
        return abs(value - expected) <= 0.5 * 10.0 ** step * (1 + 1e-9)
    if isinstance(expected, int) and not isinstance(expected, bool) and isinstance(value, float):
        return abs(value - expected) <= 0.5  # a float written as a whole number
    return value == expected


def check_key(path: Path, content: Any, cell: str) -> Optional[str]:
    """What is wrong with one key cell entry of ``path``'s table, or None."""
    key, _, literal = (cell.partition(" = ") if " = " in cell else (cell, "", ""))
    if path.suffix != ".json":
        return None if key in content else f"{path.name}: no line holds {key!r}"
    try:
        values = resolve(content, key)
    except ValueError as exc:
        return f"{path.name}: {exc}"
    if not values:
        return f"{path.name}: {key!r} is not in the file"
    if literal and not all(matches(v, literal) for v in values):
        shown = ", ".join(repr(v)[:60] for v in values if not matches(v, literal))[:200]
        return f"{path.name}: {key} is {shown}, not {literal}"
    return None


def problems(text: str, root: Path) -> List[str]:
    """Everything CLAIMS.md says that the tree does not bear out."""
    found = sections(text)
    wrong: List[str] = []
    results = root / RESULTS
    on_disk = sorted(str(p.relative_to(root)) for p in results.rglob("*") if p.suffix in RESULT_SUFFIXES)
    wrong += [f"{name}: a result file CLAIMS.md does not list" for name in on_disk if name not in found]
    for name, section in found.items():
        path = root / name
        if section["repeated"]:
            wrong.append(f"{name}: listed twice")
        if not path.is_file():
            wrong.append(f"{name}: listed, but there is no such file")
            continue
        if name.startswith(RESULTS + "/"):
            wrong += [f"{name}: no '- {f}:' line" for f in FIELDS if f not in section["fields"]]
        if not section["rows"]:
            wrong.append(f"{name}: no claim")
        text_of = path.read_text(encoding="utf-8")
        content = json.loads(text_of) if path.suffix == ".json" else text_of
        recorded = (content.get("provenance") or {}).get("commit") or content.get("commit") \
            if isinstance(content, dict) else None
        commit = section["fields"].get("commit", "")
        if recorded and f"measured at {recorded[:7]}" not in commit:
            wrong.append(f"{name}: the file records commit {recorded}; CLAIMS.md says {commit!r}")
        if name.startswith(RESULTS + "/") and not recorded and not re.search(
                r"none recorded.*committed at [0-9a-f]{7}", commit):
            wrong.append(f"{name}: records no commit; CLAIMS.md must say 'none recorded' and 'committed at'")
        for cells in section["rows"]:
            if len(cells) != 4:
                wrong.append(f"{name}: a row with {len(cells)} cells, not 4 (claim | value | key | quoted in)")
                continue
            keys = CODE.findall(cells[2])
            if not keys:
                wrong.append(f"{name}: {cells[0]!r} names no key")
            wrong += [w for w in (check_key(path, content, k) for k in keys) if w]
            wrong += [f"{name}: {cells[0]!r} is quoted in {q}, which does not exist"
                      for q in CODE.findall(cells[3]) if not (root / q.split(":")[0]).exists()]
    return wrong


def test_claims_md_matches_the_results_and_the_tree():
    assert problems(CLAIMS.read_text(encoding="utf-8"), ROOT) == []


# --- the check itself, on a tree of its own ------------------------------------------------------

LISTED = """# Claims

## `benchmarks/results/speed.json`

- command: `python benchmarks/speed.py --out benchmarks/results/speed.json`
- commit: none recorded; committed at abc1234 (not the measuring commit)
- machine: a laptop
- date: none recorded

| claim | value | key | quoted in |
|---|---|---|---|
| seconds | 0.235 | `runs[name=warm].seconds = 0.235` | `README.md` |
| ratio | 20x | `"per.forward" = 20.0` | `README.md` |
"""


@pytest.fixture
def tree(tmp_path):
    (tmp_path / RESULTS).mkdir(parents=True)
    (tmp_path / "README.md").write_text("0.235 s\n")
    (tmp_path / RESULTS / "speed.json").write_text(json.dumps(
        {"runs": [{"name": "cold", "seconds": 1.2}, {"name": "warm", "seconds": 0.2347}], "per.forward": 19.98}))
    assert problems(LISTED, tmp_path) == []
    return tmp_path


def test_a_results_file_added_without_a_line_fails(tree):
    (tree / RESULTS / "nested").mkdir()
    (tree / RESULTS / "nested" / "new_run.json").write_text("{}")
    (tree / RESULTS / "summary.txt").write_text("3x\n")
    assert problems(LISTED, tree) == [
        "benchmarks/results/nested/new_run.json: a result file CLAIMS.md does not list",
        "benchmarks/results/summary.txt: a result file CLAIMS.md does not list"]


def test_a_listed_file_that_is_gone_fails(tree):
    (tree / RESULTS / "speed.json").unlink()
    assert problems(LISTED, tree) == ["benchmarks/results/speed.json: listed, but there is no such file"]


def test_a_key_the_file_does_not_hold_or_a_figure_it_does_not_say_fails(tree):
    text = LISTED.replace("runs[name=warm].seconds = 0.235", "runs[name=hot].seconds").replace("= 20.0", "= 21.0")
    assert problems(text, tree) == ["speed.json: 'runs[name=hot].seconds' is not in the file",
                                    "speed.json: \"per.forward\" is 19.98, not 21.0"]


def test_a_recorded_commit_must_be_the_one_given(tree):
    (tree / RESULTS / "speed.json").write_text(json.dumps(
        {"provenance": {"commit": "0123456789abcdef"}, "runs": [{"name": "warm", "seconds": 0.2347}], "per.forward": 20}))
    assert problems(LISTED, tree) == [
        "benchmarks/results/speed.json: the file records commit 0123456789abcdef; CLAIMS.md says "
        "'none recorded; committed at abc1234 (not the measuring commit)'"]
    assert problems(LISTED.replace("none recorded; committed at abc1234 (not the measuring commit)",
                                   "measured at 0123456"), tree) == []


def test_the_accuracy_figure_the_error_model_rests_on_is_what_the_files_give():
    """115 of 118 within 3x (docs/error-model.md and the factor of 3 of probe/verdict.py and
    rules/model/unflagged_hotspot.py): the report of predicted.json against h200.json."""
    from benchmarks import accuracy

    results = ROOT / RESULTS
    predicted, measured = (json.loads((results / name).read_text()) for name in ("predicted.json", "h200.json"))
    assert "within 3x of measured: **115/118** (model, mode) pairs" in accuracy.report(predicted, [measured])
