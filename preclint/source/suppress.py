"""Suppression comments, for source and graph findings alike.

Honoured on the line a finding is reported at, and on the lines of its related locations (a graph
finding's related location is the line that builds the module: a suppression there reads naturally):

    x = conv(y)  # preclint: ignore[PCL101]        only PCL101 (names work too: ignore[fp16-overflow])
    x = conv(y)  # preclint: ignore                any preclint finding
    x = conv(y)  # noqa: PCL101, E501              PCL101 (other tools' codes are theirs)
    x = conv(y)  # noqa                            anything (flake8's and Ruff's blanket form)

Unused suppressions are reported by the rule that declares it reports them
(preclint/rules/source/unused_suppression.py): a listed PCL code whose rule ran over the file and found nothing on
that line, an unknown PCL code, or a bare ``# preclint: ignore`` with nothing to silence when every
rule ran. A bare ``# noqa`` is never
reported: it is shared with the other linters a project runs.

A suppression on a line that holds a bidirectional control character (the embeddings and overrides
U+202A-U+202E, the isolates U+2066-U+2069, the marks U+200E, U+200F and U+061C) silences nothing and is
reported, whatever its form: such a character makes the line read differently in an editor or a
review than Python reads it (Trojan Source, CVE-2021-42574), so a suppression can be hidden behind
one, or a comment made to look like code.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Set, Tuple, Union

from preclint.core.findings import Finding, Location
from preclint.text import lexical
from preclint.rules import all_rules, unused_suppression_rule
from preclint.text.safe_io import read_regular_or_none
from preclint.text.sourcefile import decode, ParseFailure

_NOQA = re.compile(r"#\s*noqa(?::\s?(?P<codes>[A-Za-z]+[0-9]+(?:[,\s]+[A-Za-z]+[0-9]+)*))?", re.IGNORECASE)
_PRECLINT = re.compile(r"#\s*preclint:\s*ignore(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)
_CODE = re.compile(r"^PCL[0-9]{3}$")
_MAY_NAME_PRECLINT = re.compile(r"(?i)preclint:|noqa[^\n]*pcl")
# the characters that reorder how a line is shown (Unicode's bidirectional controls)
_BIDI = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c]")
_LINE_BREAK = re.compile(r"\r\n|\r|\n")  # as preclint.text.lexical counts lines


@dataclass
class Directive:
    line: int
    column: int  # 1-based, where the directive's ``#`` is
    kind: str  # "noqa" or "preclint"
    codes: Tuple[str, ...]  # () for the blanket forms; PCL codes only (names resolved)
    unknown: Tuple[str, ...] = ()  # PCL-looking codes and names that name no rule
    bidi: Tuple[str, ...] = ()  # the bidirectional controls on its line ("U+202E"): it is void

    def covers(self, code: str) -> bool:
        # ``ignore[PCL599]`` (a code or name no rule has, a typo) is no blanket ignore: it silences nothing
        return not self.bidi and (self.blanket or code in self.codes)

    @property
    def blanket(self) -> bool:
        return not self.codes and not self.unknown


def _comments(text: str) -> Iterable[Tuple[int, int, str]]:
    """(line, 1-based column, text) of each comment, broken file or not (``preclint.text.lexical``)."""
    for comment in lexical.comments(text):
        yield comment.line, comment.column + 1, comment.text


@functools.lru_cache(maxsize=1)
def _known():
    rules = all_rules()
    return set(rules), {rule.name: code for code, rule in rules.items()}


def _may_hold_directives(text: str) -> bool:
    lowered = text.lower()
    return "noqa" in lowered or "preclint:" in lowered


def parse_directives(text: str) -> Dict[int, List[Directive]]:
    """Suppression directives by line. Cheap on files without any: no tokenizing then."""
    if not _may_hold_directives(text):
        return {}
    known_codes, names = _known()
    found: Dict[int, List[Directive]] = {}
    lines = _LINE_BREAK.split(text) if _BIDI.search(text) else None
    for line, column, comment in _comments(text):
        bidi = _bidi_controls(lines[line - 1]) if lines is not None and line <= len(lines) else ()
        for kind, regex in (("preclint", _PRECLINT), ("noqa", _NOQA)):
            for match in regex.finditer(comment):
                raw = [c for c in re.split(r"[,\s]+", match.group("codes") or "") if c]
                codes, unknown = [], []
                for item in raw:
                    code = item.upper()
                    if code in known_codes:
                        codes.append(code)
                    elif item.lower() in names:
                        codes.append(names[item.lower()])
                    elif code.startswith("PCL") or kind == "preclint":
                        unknown.append(item)
                    # other tools' codes (E501, TOR101) in a noqa list are theirs: not ours to judge
                if raw and not codes and not unknown:
                    continue  # ``# noqa: E501`` says nothing to preclint
                found.setdefault(line, []).append(
                    Directive(line, column + match.start(), kind, tuple(codes), tuple(unknown), bidi)
                )
    return found


def _bidi_controls(line: str) -> Tuple[str, ...]:
    """The bidirectional controls in ``line``, each once, as ``U+202E``."""
    return tuple(dict.fromkeys(f"U+{ord(char):04X}" for char in _BIDI.findall(line)))


def may_name_preclint(text: str) -> bool:
    """Whether ``text`` can hold a suppression that names preclint or a PCL code: only such a
    directive can be reported unused (a bare ``# noqa`` and ``# noqa: E501`` never are)."""
    return _may_hold_directives(text) and _MAY_NAME_PRECLINT.search(text) is not None


def file_directives(text: str, has_findings: bool) -> Dict[int, List[Directive]]:
    """The directives of a file that ``apply_suppressions`` can use: every one when the file has
    findings to silence, else those of a file that may name preclint (others cannot be reported
    unused), else none. Stored with a file's findings in the cache, so that an unchanged file is
    neither read nor tokenized for its suppressions again."""
    return parse_directives(text) if has_findings or may_name_preclint(text) else {}


def _read(path: str, texts: Mapping[str, str]) -> Optional[str]:
    if path in texts:
        return texts[path]

    data = read_regular_or_none(path)
    if data is None:
        return None

    try:
        return decode(data)
    except ParseFailure:
        return None


def apply_suppressions(
    findings: Iterable[Finding],
    report_unused: Union[bool, Callable[[], bool]],
    checked_codes: Optional[Iterable[str]] = None,
    files: Iterable[str] = (),
    texts: Optional[Mapping[str, str]] = None,
    known: Optional[Mapping[str, Dict[int, List[Directive]]]] = None,
) -> List[Finding]:
    """``findings`` less the suppressed ones, plus PCL500 findings for unused suppressions when
    ``report_unused`` (a bool, or a function asked only where some file holds a directive).

    Paths in the findings' locations are read relative to the working directory (as printed).
    ``checked_codes``: the codes whose rules ran over these files; a suppression naming another code
    is never called unused (a graph code in a source-only run). None means every rule ran.
    ``files``: files to look for unused suppressions in besides those with findings.
    ``texts``: file contents already read, by path.
    ``known``: directives already found, by path (``file_directives``: a file there is not read).
    """
    findings = list(findings)
    texts = dict(texts or {})
    directives: Dict[str, Dict[int, List[Directive]]] = dict(known or {})

    def directives_of(path: str) -> Dict[int, List[Directive]]:
        if path not in directives:
            text = _read(path, texts)
            directives[path] = parse_directives(text) if text is not None else {}
        return directives[path]

    used: Set[Tuple[str, int, int, str]] = set()  # (path, line, column, code) of directives that silenced
    kept = []
    for finding in findings:
        places = [finding.location] + [loc for loc, _ in finding.related if isinstance(loc, Location)]
        silenced = False
        for place in places:
            if place is None or not place.path or place.library:  # no comment of the user's can be there
                continue
            for directive in directives_of(place.path).get(place.line, ()):
                if directive.covers(finding.code):
                    used.add((place.path, directive.line, directive.column, finding.code))
                    silenced = True
        if not silenced:
            kept.append(finding)
    if not report_unused:
        return kept
    paths = {f.location.path for f in findings if f.location is not None and f.location.path}
    with_directives = []
    for path in sorted(paths | set(files)):
        if path not in directives:
            # a file without findings can only hold an unused suppression that names preclint or a
            # PCL code (a bare ``# noqa`` and ``# noqa: E501`` are never reported): most files of a
            # project that uses flake8 hold neither, and need no tokenizing
            text = _read(path, texts)
            if text is None or not may_name_preclint(text):
                continue
        if directives_of(path):
            with_directives.append(path)
    # (the rules are asked for only where a directive may be unused: a model's check with none
    # imports no source rule)
    if not with_directives or (callable(report_unused) and not report_unused()):
        return kept

    reporter = unused_suppression_rule()
    every = set(all_rules())
    checked = every if checked_codes is None else set(checked_codes)
    silenced_at = {(path, line, column) for path, line, column, _ in used}
    for path in with_directives:
        for line, line_directives in sorted(directives_of(path).items()):
            for directive in line_directives:
                if directive.bidi:  # void, whatever it names: said, so that nobody believes it holds
                    kept.append(reporter.voided_suppression(Location(path, line, directive.column), directive.bidi))
                    continue
                if reporter.code in directive.codes or (directive.kind == "noqa" and directive.blanket):
                    continue
                unused = tuple(
                    code for code in directive.codes
                    if code in checked and (path, line, directive.column, code) not in used
                )
                blanket_unused = (
                    directive.blanket and checked >= every and (path, line, directive.column) not in silenced_at
                )
                if unused or directive.unknown or blanket_unused:
                    kept.append(
                        reporter.unused_suppression(
                            Location(path, line, directive.column), unused, directive.unknown
                        )
                    )
    return kept
