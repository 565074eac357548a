"""What ``preclint check`` does with the source side of a run: ``--source-only`` end to end, and the
suppression and baseline steps that graph findings go through too. The CLI parses arguments and
calls these; nothing here imports torch.
"""
from __future__ import annotations

import os
import sys
from typing import Iterable, List, Optional, Sequence, TextIO, Tuple

from preclint.config import Config
from preclint.core.errors import UserError
from preclint.core.exitcodes import EXIT_ERROR, EXIT_FINDINGS, EXIT_OK, exit_code
from preclint.core.findings import Finding
from preclint.core.notes import Note
from preclint.report.output import write_report, check_output_target
from preclint.text.paths import display_path
from preclint.report import render, Report
from preclint.report.escape import console_line, diff_path, log_lines, visible_text
from preclint.rules import graph_rules
from preclint.source.baseline import filter_baseline, finding_key, read_baseline, write_baseline as write
from preclint.source.run import reports_unused
from preclint.source.suppress import apply_suppressions


def apply_baseline(
    findings: List[Finding], baseline: Optional[str] = None, write_baseline: Optional[str] = None
) -> Tuple[List[Finding], List[Note]]:
    """(findings to report, notes for the report) after ``--baseline`` / ``--write-baseline``."""

    notes: List[Note] = []
    if write_baseline:
        count = write(findings, write_baseline)
        notes.append(Note("baseline", f"baseline: wrote {count} finding{'s' if count != 1 else ''} to {write_baseline}"))
    if baseline:
        before = len(findings)
        findings, stale = filter_baseline(findings, baseline)
        notes.append(Note("baseline", f"baseline: {before - len(findings)} known finding(s) hidden by {baseline}"))
        if stale:
            notes.append(Note(
                "baseline", f"baseline: {stale} record(s) in {baseline} match nothing any more (fixed?); "
                "refresh it with --write-baseline"
            ))
    return findings, notes


def check_baseline_arguments(baseline: Optional[str], write_baseline: Optional[str], paths: Sequence[str],
                             inputs: Sequence[Tuple[Optional[str], str]] = ()) -> None:
    """Mistakes in --baseline / --write-baseline, found before any work is done: an unreadable or
    invalid baseline; a baseline target that is a directory, one of the checked ``paths``, another
    of the run's ``inputs`` (its configuration, a weights file; the baseline it reads may be
    refreshed) or the report's own stdout."""

    if baseline:
        read_baseline(baseline)
    if write_baseline:
        others = [(path, role) for path, role in inputs if path not in (baseline, write_baseline)]
        check_output_target(write_baseline, checked=paths, inputs=others)


def apply_baseline_to_reports(reports: Sequence, baseline: Optional[str] = None, write_baseline: Optional[str] = None) -> bool:
    """``apply_baseline`` over the findings of several reports (one per model) at once, in place;
    the notes go to the last report of a model that was checked. Returns whether the baseline was
    written: not when a model could not be checked, as its findings would be missing from it."""
    checked = [report for report in reports if report.error is None]
    if len(checked) < len(reports):
        write_baseline = None
    everything = [f for report in checked for f in report.findings]
    kept, notes = apply_baseline(everything, baseline, write_baseline)
    kept_ids = {id(f) for f in kept}
    for report in checked:
        report.findings = [f for f in report.findings if id(f) in kept_ids]
    if checked:
        checked[-1].notes.extend(notes)
    return bool(write_baseline)


def model_file_source_findings(filename: str, config: Config) -> Tuple[List[Finding], List[str]]:
    """(findings, codes of the rules that ran) of the source rules on the file a model was loaded
    from, as ``--source-only`` finds them (its excludes, per-file-ignores, unreadable-file findings),
    before suppression comments: the graph check suppresses them with its own findings, in one pass,
    so that an unused or unknown suppression is reported once. Reads the file; never runs it, and
    writes no cache (the check of a model was never a source run's)."""
    from preclint.source.run import check_paths  # lazy: looked up at each call, so that it can be replaced

    run = check_paths([filename], config, cache=False, jobs=1, suppress=False)
    return run.findings, run.codes


def suppress_graph_findings(findings: Iterable[Finding], config: Config, model_files: Sequence[str] = (),
                            also_checked: Sequence[str] = ()) -> List[Finding]:
    """Suppressions (and per-file-ignores) for the findings of a graph check: the codes judged for
    unused suppressions are the graph rules that ran and ``also_checked`` (the source rules run on
    the model's file); ``model_files`` are searched for them too."""

    findings = list(findings)
    files = [display_path(p) for p in model_files if os.path.isfile(p)]
    if not findings and not files:  # nothing to filter and no file to look for unused suppressions in
        return []
    checked = [rule.code for rule in graph_rules() if config.is_selected(rule.code)] + list(also_checked)
    kept = [
        f for f in findings
        if f.location is None or not config.ignored_for_file(f.location.path, f.code)
    ]
    return apply_suppressions(kept, lambda: _reports_unused(config), checked, files=files)


def _reports_unused(config: Config) -> bool:
    return reports_unused(config)


def run_source_only(
    paths: Sequence[str],
    config: Config,
    *,
    fix: bool = False,
    diff: bool = False,
    baseline: Optional[str] = None,
    write_baseline: Optional[str] = None,
    exit_zero: bool = False,
    color: bool = False,
    out: Optional[TextIO] = None,
    err: Optional[TextIO] = None,
    cache: bool = True,
    unsafe_fixes: bool = False,
) -> int:
    """``preclint check --source-only PATH...``: returns the exit code (UserError propagates).

    ``--diff`` prints the fixes as a unified diff and writes nothing (exit 1 when there is a diff,
    as Ruff does); ``--fix`` writes them and reports what is left; ``unsafe_fixes`` adds the fixes
    that may change behaviour (``--unsafe-fixes``, as in Ruff). ``cache=False`` (``--no-cache``)
    neither reads nor writes the cache. Files skipped (a FIFO, a dangling symlink) are noted on
    stderr as warnings and in the report. The diff and the warnings show names as report.escape
    does: a file name or a source line cannot move the terminal or give a CI runner a command.
    """
    from preclint.source.run import check_paths, selected_rules  # lazy: looked up at each call, so that it can be replaced

    out = out or sys.stdout
    err = err or sys.stderr
    check_baseline_arguments(baseline, write_baseline, paths, inputs=[(config.path, "the configuration this run reads")])
    run = check_paths(paths, config, cache=cache)
    if not run.files and not run.excluded:
        raise UserError(nothing_checked(paths, run.notes))
    if run.excluded:  # said once, on stderr: pre-commit shows it only when the hook fails
        n = len(run.excluded)
        err.write(f"note: {n} named file{'s' if n != 1 else ''} excluded by the configuration (force-exclude): "
                  "not checked\n")
    notes = list(run.notes)
    unwritable = 0
    if fix or diff:
        from preclint.source.fix import fix_run, unified_diff, write_fixes  # lazy: libcst only where a source file is parsed

        rules = [rule() for rule in selected_rules(config)]
        keep = _baseline_keep(run.findings, baseline)
        result = fix_run(run, rules, config, keep, unsafe=unsafe_fixes)
        if result.unfinished:
            from preclint.source.fix import MAX_ROUNDS  # lazy: libcst only where a source file is parsed

            first, more = result.unfinished[0], len(result.unfinished) - 1
            notes.append(Note("source", f"{first}{f' and {more} more file(s)' if more else ''}: fixes still left "
                                        f"after {MAX_ROUNDS} rounds of fixing; run again to apply them"))
        if diff:
            write_report(log_lines(visible_text(unified_diff(run, result, header_path=diff_path))), out, fmt="diff")
            n = len(result.texts)
            err.write(f"{result.total} fix{'es' if result.total != 1 else ''} in {n} file{'s' if n != 1 else ''} would be applied.\n")
            return EXIT_OK if not result.texts or exit_zero else EXIT_FINDINGS
        written = write_fixes(run, result, tell=lambda line: err.write(line + "\n"))
        notes += [Note("source", line) for line in written.skipped]
        fixed = sum(result.counts[path] for path in written.fixed)
        if fixed:
            err.write(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.\n")
            run = check_paths(paths, config, cache=cache)  # report what is left, at its new positions
        unwritable = len(written.failed)
    if config.output_format != "full":  # the full report prints its notes itself
        for note in notes:
            err.write(console_line(f"warning: {note.text}") + "\n")
    findings, baseline_notes = apply_baseline(run.findings, baseline, write_baseline)
    report = Report(findings=findings, files=list(run.files), notes=notes + baseline_notes)
    write_report(render(report, config.output_format, color=color), out, fmt=config.output_format)
    if unwritable:  # an error (said above, one line a file), not "findings left", whatever --exit-zero says
        return EXIT_ERROR
    if write_baseline:
        return EXIT_OK
    return exit_code(findings, config.fail_on, exit_zero)


def nothing_checked(paths: Sequence[str], notes: Sequence[Note]) -> str:
    """The error of a run that read no file: it must not pass as "No findings." (a named directory
    its configuration excludes, ``exclude = ["*.py"]``, an empty directory). Files that the
    configuration leaves out of a run that named them (``--force-exclude``, pre-commit's hook) were
    the user's choice, said in a note: that run passes, as Ruff's does."""
    shown = ", ".join(paths[:3]) + (f" and {len(paths) - 3} more" if len(paths) > 3 else "")
    if notes:  # what was there could not be read (a FIFO, a dangling link, a directory not listed)
        why = notes[0].text + (f"; {len(notes) - 1} more skipped" if len(notes) > 1 else "")
    else:
        why = ("there is none, or the configuration's exclude, .gitignore or the default excludes (build/, .venv/, ...) "
               "leave out every one")
    return f"no Python file was checked under {shown}: {why}; a run that checks nothing is no pass"


def _baseline_keep(findings: List[Finding], baseline: Optional[str]):
    """A predicate that is False for findings the baseline accepts: those are not fixed either."""
    if not baseline:
        return lambda finding: True

    kept, _ = filter_baseline(findings, baseline)
    new_keys = {finding_key(f) for f in kept}
    return lambda finding: finding_key(finding) in new_keys
