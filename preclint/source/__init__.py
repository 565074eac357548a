"""The source-only check: running the source rules over files, suppression comments, fixes, baselines
and the cache. Nothing in this package imports torch or the checked code (reading the files is
preclint.text's job).

The entry points other parts of preclint call:

    apply_suppressions(findings, report_unused, checked_codes=None, files=(), texts=None) -> [Finding]
    run_source_only(paths, config, fix=..., diff=..., baseline=..., write_baseline=...) -> exit code
    check_text(text, path) / check_file(filename) -> [Finding]      preclint.source.run (one file,
                                                                     in-process; any input is safe)
    suppress_graph_findings(findings, config, model_files) -> [Finding]
    apply_baseline(findings, baseline=None, write_baseline=None) -> ([Finding], notes)
"""
from __future__ import annotations


def __getattr__(name):
    # lazy, so that importing one submodule does not import them all
    if name == "apply_suppressions":
        from preclint.source.suppress import apply_suppressions  # lazy: one submodule imported loads not all of them

        return apply_suppressions
    if name in ("run_source_only", "suppress_graph_findings", "apply_baseline", "apply_baseline_to_reports"):
        from preclint.source import command  # lazy: one submodule imported loads not all of them

        return getattr(command, name)
    if name in ("check_text", "check_file"):
        from preclint.source import run  # lazy: one submodule imported loads not all of them

        return getattr(run, name)
    raise AttributeError(name)
