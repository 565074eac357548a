"""The source-only check: find the files, run the selected source rules over each, apply
per-file-ignores and suppressions. Never imports torch or the checked code.

A file is parsed only when its text holds a word one of the selected rules needs (the TorchFix
trick: most files of a project never mention ``allclose`` or ``allow_tf32``), and each parsed file is
walked once (preclint.source.index) whatever the number of rules.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from preclint.config import Config
from preclint.errors import UserError
from preclint.findings import Finding
from preclint.source.discover import discover
from preclint.source.paths import display_path
from preclint.source.sourcefile import ParseFailure, SourceFile
from preclint.source.suppress import apply_suppressions


@dataclass
class SourceRun:
    findings: List[Finding] = field(default_factory=list)  # after ignores and suppressions, unsorted
    files: List[str] = field(default_factory=list)  # every file checked, as printed
    sources: Dict[str, SourceFile] = field(default_factory=dict)  # files that were read, by printed path
    codes: List[str] = field(default_factory=list)  # the codes whose rules ran


def selected_rules(config: Config) -> List[type]:
    """The source rule classes the configuration selects (PCL500/PCL599 included: they are rules)."""
    from preclint.rules import source_rules

    return [rule for rule in source_rules() if config.is_selected(rule.code)]


def wanted(rule, text: str) -> bool:
    """Whether ``text`` can hold a finding of ``rule``: every group of its ``triggers`` has a word
    in the text. A rule without triggers wants every file."""
    return all(any(word in text for word in group) for group in getattr(rule, "triggers", ()))


def check_source(source: SourceFile, rules: Sequence) -> List[Finding]:
    """The findings of ``rules`` (instances) on one file, before suppressions. A file that cannot be
    parsed yields one PCL599 finding."""
    active = [rule for rule in rules if not getattr(rule, "after_suppressions", False) and wanted(rule, source.text)]
    if source.decode_failure is None and not active:
        return []
    try:
        source.module
    except ParseFailure as failure:
        from preclint.rules.unparsable_file import UnparsableFile

        return [UnparsableFile.finding_for(source.path, failure.message, failure.line, failure.column)]
    findings: List[Finding] = []
    try:
        for rule in active:
            findings.extend(rule.check_source(source))
    except RecursionError:
        # libcst computes positions by recursive code generation: an expression nested thousands
        # deep (generated code) exhausts the interpreter's stack; the file is reported, the run goes on
        from preclint.rules.unparsable_file import UnparsableFile

        source.fixes.clear()
        return [UnparsableFile.finding_for(source.path, "cannot check the file: expressions are nested too deeply")]
    return findings


def check_text(text: str, path: str = "snippet.py", config: Optional[Config] = None, report_unused: bool = True) -> List[Finding]:
    """Every selected source rule on ``text`` as if it were the file ``path``, suppressions applied:
    what ``preclint check --source-only`` reports for that file. For tests and editors."""
    config = config or Config()
    source = SourceFile(path, text)
    rules = [rule() for rule in selected_rules(config)]
    findings = check_source(source, rules)
    codes = [rule.code for rule in rules]
    return apply_suppressions(
        findings, report_unused and config.is_selected("PCL500"), codes, files=[path], texts={path: text}
    )


def check_paths(paths: Sequence[str], config: Config, cwd: Optional[str] = None) -> SourceRun:
    """The source-only check of ``paths`` (files and directories). Unreadable paths raise UserError."""
    cwd = cwd or os.getcwd()
    files = discover(paths, config.exclude, config.root or cwd)
    rule_classes = selected_rules(config)
    rules = [rule() for rule in rule_classes]
    run = SourceRun(codes=[rule.code for rule in rules])
    parse_code = "PCL599"
    findings: List[Finding] = []
    for filename in files:
        shown = display_path(filename, cwd)
        run.files.append(shown)
        try:
            source = SourceFile.read(filename, shown)
        except OSError as exc:
            raise UserError(f"{shown}: cannot read: {exc.strerror or exc}") from None
        run.sources[shown] = source
        for finding in check_source(source, rules):
            if finding.code == parse_code and config.is_ignored_explicitly(parse_code):
                continue
            if not config.ignored_for_file(shown, finding.code):
                findings.append(finding)
    texts = {path: source.text for path, source in run.sources.items() if source.decode_failure is None}
    report_unused = config.is_selected("PCL500")
    kept = apply_suppressions(findings, report_unused, run.codes, files=run.files, texts=texts)
    run.findings = [f for f in kept if f.code != "PCL500" or not config.ignored_for_file(f.location.path, f.code)]
    return run
