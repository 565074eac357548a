"""The source-only check: find the files, run the selected source rules over each, apply
per-file-ignores and suppressions. Never imports torch or the checked code.

A file is parsed only when its text holds a word one of the selected rules needs (the TorchFix
trick: most files of a project never mention ``allclose`` or ``allow_tf32``), and each parsed file is
walked once (preclint.text.index) whatever the number of rules. Files are checked on every core the
run may use (preclint.source.parallel), and a file that has not changed since the last run is
neither parsed nor tokenized for its suppression comments again (preclint.source.cache).

For one file in-process (an editor, a fuzzer): ``check_text(text, path)`` or ``check_file(filename)``.
Neither can crash or hang on any input: parsing is guarded (preclint.text.guard).
"""
from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

from preclint.config import Config
from preclint.core.findings import Finding
from preclint.core.notes import Note
from preclint.source.collector import collector_paused
from preclint.text.discover import discover
from preclint.text.guard import MAX_DEPTH, run_with_deep_stack
from preclint.text.paths import display_path
from preclint.text.safe_io import NotRegularFile
from preclint.text.sourcefile import ParseFailure, SourceFile
from preclint.source.suppress import Directive, apply_suppressions, file_directives
from preclint.rules import source_rules, unreadable_file_rule, unused_suppression_rule
from preclint.source.cache import Cache, content_digest
from preclint.source.parallel import available_cores, map_checked


@dataclass
class SourceRun:
    findings: List[Finding] = field(default_factory=list)  # after ignores and suppressions, unsorted
    files: List[str] = field(default_factory=list)  # every file checked, as printed
    sources: Dict[str, SourceFile] = field(default_factory=dict)  # files that were read, by printed path
    codes: List[str] = field(default_factory=list)  # the codes whose rules ran
    notes: List[Note] = field(default_factory=list)  # what was skipped, and why
    excluded: List[str] = field(default_factory=list)  # files named but left out by --force-exclude
    filenames: Dict[str, str] = field(default_factory=dict)  # printed path -> the path it was read from
    roots: List[str] = field(default_factory=list)  # real paths of what the run was given: fixes stay inside
    parsed: int = 0  # files parsed in this run (not answered by the prefilter or the cache)
    cached: int = 0  # files answered by the cache


def selected_rules(config: Config) -> List[type]:
    """The source rule classes the configuration selects (those the runner reports through included)."""

    return [rule for rule in source_rules() if config.is_selected(rule.code)]


def reports_unused(config: Config) -> bool:
    """Whether the configuration selects the rule that reports unused suppressions."""

    return config.is_selected(unused_suppression_rule().code)


_WORDS: Dict[tuple, Tuple["re.Pattern[str]", ...]] = {}


def _patterns(group: tuple) -> Tuple["re.Pattern[str]", ...]:
    """One regex a trigger of the group: words, strings with punctuation, or regexes. Each starts
    with its literal, so that the regex engine scans for it at C speed."""
    patterns = _WORDS.get(group)
    if patterns is None:
        # a trigger that is a word (``amp``) must not be part of a longer one (``example``, ``clamp``
        # do not count; ``allow_tf32`` counts for ``tf32``); one with punctuation (``e-``) is searched as is
        patterns = _WORDS[group] = tuple(
            w if isinstance(w, re.Pattern)
            else re.compile(rf"{re.escape(w)}(?<![A-Za-z0-9]{re.escape(w)})(?![A-Za-z0-9])") if w.isidentifier()
            else re.compile(re.escape(w))
            for w in group
        )
    return patterns


_ORDERED: Dict[tuple, List[tuple]] = {}


def _cheapest_first(rule) -> List[tuple]:
    """A rule's trigger groups, those of plain words first: a word is found by a literal scan at C
    speed, a regex such as PCL505's exponent pattern steps through every character. The groups are
    a conjunction, so their order changes the cost, never the answer."""
    triggers = tuple(tuple(group) for group in rule.triggers)
    ordered = _ORDERED.get(triggers)
    if ordered is None:
        ordered = _ORDERED[triggers] = sorted(triggers, key=lambda group: any(isinstance(w, re.Pattern) for w in group))
    return ordered


def wanted(rule, text: str, seen: Optional[Dict["re.Pattern[str]", bool]] = None) -> bool:
    """Whether ``text`` can hold a finding of ``rule``: every group of its ``triggers`` (words, or
    regexes) matches in the text, a word not inside a longer one. A rule without triggers wants
    every file. ``seen``: what each pattern answered on this text before (rules share words)."""
    seen = {} if seen is None else seen

    def found(pattern) -> bool:
        answer = seen.get(pattern)
        if answer is None:
            answer = seen[pattern] = pattern.search(text) is not None
        return answer

    return all(any(found(pattern) for pattern in _patterns(group)) for group in _cheapest_first(rule))


def trigger_regex(rules: Sequence) -> Optional["re.Pattern[str]"]:
    """A regex for anything some rule of ``rules`` looks for; None when one looks at everything."""
    groups: List = []
    for rule in rules:
        if not rule.triggers:
            return None
        groups += [item for group in rule.triggers for item in group]
    patterns = _patterns(tuple(dict.fromkeys(groups)))
    return re.compile("|".join(f"(?:{p.pattern})" for p in patterns))


def _active(rules: Sequence, source: SourceFile) -> List:
    seen: Dict["re.Pattern[str]", bool] = {}
    return [rule for rule in rules if not rule.after_suppressions and wanted(rule, source.text, seen)]


def focus_regex(rules: Sequence) -> Optional["re.Pattern[str]"]:
    """What a top-level function or class must hold for a finding of ``rules`` to be in it: the words
    of their trigger groups, less the group that only names the module a rule is about (``torch``
    tells which files, not which functions). None when a rule looks at everything."""
    groups: List = []
    for rule in rules:
        triggers = [tuple(group) for group in rule.triggers]
        if not triggers:
            return None
        groups += [item for group in triggers if group != ("torch",) for item in group]
    patterns = _patterns(tuple(dict.fromkeys(groups)))
    return re.compile("|".join(f"(?:{p.pattern})" for p in patterns)) if patterns else None


def check_source(source: SourceFile, rules: Sequence, focus: bool = False) -> List[Finding]:
    """The findings of ``rules`` (instances) on one file, before suppressions. A file that cannot be
    parsed yields one finding of the rule that reports unreadable files. Parsing and the rules run on a thread with a deep stack.

    ``focus``: top-level functions and classes that hold no word of the rules that run are blanked
    before libcst parses the file (positions kept): they cannot hold a finding, and most of a large
    module's text is in them. The tree then is not the file's, so fixes are made from a full parse
    (``preclint.source.fix`` parses again)."""
    active = _active(rules, source)
    if source.decode_failure is None and not active:
        return []
    if focus:
        source.focus = focus_regex(active)
    with collector_paused():  # libcst's tree of a large file would make each collection walk it all
        if threading.current_thread().name == "preclint-check":
            return _check_source(source, active)
        return run_with_deep_stack(lambda: _check_source(source, active))


def _unreadable(path: str, message: str, line: int = 1, column: int = 1) -> List[Finding]:
    """The finding for a file no rule could check."""

    return [unreadable_file_rule().unreadable_file(path, message, line, column)]


def _check_source(source: SourceFile, active: Sequence) -> List[Finding]:
    source.words = trigger_regex(active)
    try:
        source.module
    except ParseFailure as failure:
        return _unreadable(source.path, failure.message, failure.line, failure.column)
    findings: List[Finding] = []
    try:
        for rule in active:
            findings.extend(rule.check_source(source))
    except (RecursionError, MemoryError):
        source.fixes.clear()
        return _unreadable(source.path, "cannot check the file: expressions are nested too deeply")
    if source.elided:
        # the tree holds placeholders where the deep expressions were: a fix would write them back
        source.fixes.clear()
        for finding in findings:
            finding.fixable = False
    for line, depth in source.unchecked:
        findings += _unreadable(source.path, f"cannot check the expression at line {line}: it nests {depth} levels "
                                             f"deep (the limit is {MAX_DEPTH}); the rest of the file is checked", line)
    return findings


def check_text(text: str, path: str = "snippet.py", config: Optional[Config] = None, report_unused: bool = True) -> List[Finding]:
    """Every selected source rule on ``text`` as if it were the file ``path``, suppressions applied:
    what ``preclint check --source-only`` reports for that file. For tests, editors and fuzzers."""
    config = config or Config()
    source = SourceFile(path, text)
    rules = [rule() for rule in selected_rules(config)]
    findings = check_source(source, rules)
    codes = [rule.code for rule in rules]
    return apply_suppressions(
        findings, report_unused and reports_unused(config), codes, files=[path], texts={path: text}
    )


def check_file(filename: str, config: Optional[Config] = None, path: Optional[str] = None) -> List[Finding]:
    """``check_text`` for a file on disk, read as the CLI reads it (encoding cookie, BOM); ``path`` is
    the path findings print (default: relative to the working directory). OSError propagates."""
    config = config or Config()
    source = SourceFile.read(filename, path or display_path(filename))
    rules = [rule() for rule in selected_rules(config)]
    findings = check_source(source, rules)
    texts = {source.path: source.text} if source.decode_failure is None else {}
    return apply_suppressions(findings, reports_unused(config), [r.code for r in rules],
                              files=[source.path], texts=texts)


# ---------------------------------------------------------------------------- many files

_WORKER_RULES: Dict[Tuple[str, ...], List] = {}


def _rules_for(codes: Tuple[str, ...]) -> List:
    rules = _WORKER_RULES.get(codes)
    if rules is None:
        rules = _WORKER_RULES[codes] = [rule() for rule in source_rules() if rule.code in codes]
    return rules


Checked = Tuple[List[Finding], Optional[Dict[int, List[Directive]]]]


def _check_one(job: Tuple[str, bytes, Tuple[str, ...]]) -> Checked:
    """One file, from its printed path and bytes (run in a worker process): its raw findings and
    the suppression directives they need (``file_directives``; None when the file is not text)."""
    shown, data, codes = job
    source = SourceFile.from_bytes(data, shown)
    findings = check_source(source, _rules_for(codes), focus=True)
    return findings, file_directives(source.text, bool(findings)) if source.decode_failure is None else None


def _crashed(job: Tuple[str, bytes, Tuple[str, ...]]) -> Checked:
    return _unreadable(job[0], "cannot check the file: the parser crashed on it"), None


def check_paths(
    paths: Sequence[str], config: Config, cwd: Optional[str] = None, cache: bool = True, jobs: Optional[int] = None,
    *, suppress: bool = True,
) -> SourceRun:
    """The source-only check of ``paths`` (files and directories). A path that does not exist raises
    UserError; what is no regular file (a FIFO, a dangling symlink) is noted in ``run.notes`` and
    skipped, and a file that cannot be read is reported as unreadable. ``cache=False`` neither reads nor writes the cache; ``jobs`` is the
    number of processes (default: the cores this process may use). ``suppress=False``: the findings
    after per-file-ignores but before suppression comments, for a caller that suppresses them together
    with findings of its own (the graph check of a model file, in one pass)."""

    cwd = cwd or os.getcwd()
    run = SourceRun()
    files = discover(paths, config.exclude, config.root or cwd, notes=run.notes,
                     force_exclude=config.force_exclude, excluded=run.excluded)
    run.roots = [os.path.realpath(p) for p in paths]
    rules = [rule() for rule in selected_rules(config)]
    run.codes = [rule.code for rule in rules]
    codes = tuple(run.codes)
    store = None
    if cache:
        store = Cache.open(config.root or cwd, codes)
        run.notes.extend(store.notes)
        store.notes = []
    raw: Dict[str, List[Finding]] = {}
    known: Dict[str, Dict[int, List[Directive]]] = {}  # suppression directives, by printed path
    jobs_to_run: List[Tuple[str, bytes, Tuple[str, ...]]] = []
    digests: Dict[str, str] = {}
    cached: Set[str] = set()  # answered by the cache
    for filename in files:
        shown = display_path(filename, cwd)
        try:
            source = SourceFile.read(filename, shown)
        except NotRegularFile:
            run.notes.append(Note("source", f"{shown}: not a regular file; skipped"))
            continue
        except OSError as exc:  # reported, as a file nobody checked must not pass silently
            run.files.append(shown)
            raw[shown] = _unreadable(shown, f"cannot read the file: {exc.strerror or exc}")
            continue
        run.files.append(shown)
        run.sources[shown] = source
        run.filenames[shown] = filename
        if store is not None:
            digests[shown] = content_digest(source.data or b"")
            hit = store.get(filename, shown, digests[shown], source.text if source.decode_failure is None else None)
            if hit is not None:
                raw[shown], known[shown] = hit
                cached.add(shown)
                continue
        if source.decode_failure is None and not _active(rules, source):
            raw[shown], known[shown] = [], file_directives(source.text, False)
        else:
            jobs_to_run.append((shown, source.data or b"", codes))
    results = map_checked(_check_one, jobs_to_run, [len(job[1]) for job in jobs_to_run],
                          jobs if jobs is not None else available_cores(), _crashed)
    run.parsed, run.cached = len(jobs_to_run), len(cached)
    for (shown, _, _), (findings, directives) in zip(jobs_to_run, results):
        source = run.sources[shown]
        if directives is None:  # no comments to read in a file that is not text; a crashed worker's file
            directives = {} if source.decode_failure is not None else file_directives(source.text, bool(findings))
        raw[shown], known[shown] = findings, directives
    if store is not None:
        for shown in (shown for shown in known if shown not in cached):
            store.put(run.filenames[shown], shown, digests[shown], raw[shown], known[shown])
        store.save()
        run.notes.extend(store.notes)

    parse_code = unreadable_file_rule().code
    findings: List[Finding] = []
    for shown in run.files:
        for finding in raw.get(shown, ()):
            if finding.code == parse_code and config.is_ignored_explicitly(parse_code):
                continue
            if not config.ignored_for_file(shown, finding.code):
                findings.append(finding)
    unused_code = unused_suppression_rule().code
    if not suppress:
        run.findings = findings
        return run
    kept = apply_suppressions(findings, config.is_selected(unused_code), run.codes, files=run.files, known=known)
    run.findings = [f for f in kept if f.code != unused_code or not config.ignored_for_file(f.location.path, f.code)]
    return run
