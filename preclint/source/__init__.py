"""Source side of preclint: libcst locations for graph findings, the source-only rules' machinery,
suppression comments, fixes and baselines. Nothing in this package imports torch or the checked code.

The entry points other parts of preclint call:

    locate_definitions(path) -> {(class name, attribute): Location}       preclint.source.locations
    definition_location(path, class_name, attr) -> Optional[Location]
    locate_calls(path) -> {(class name, attribute): [Location, ...]}
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
    if name in ("locate_definitions", "definition_location", "locate_calls"):
        from preclint.source import locations

        return getattr(locations, name)
    if name == "apply_suppressions":
        from preclint.source.suppress import apply_suppressions

        return apply_suppressions
    if name in ("run_source_only", "suppress_graph_findings", "apply_baseline", "apply_baseline_to_reports"):
        from preclint.source import command

        return getattr(command, name)
    if name in ("check_text", "check_file"):
        from preclint.source import run

        return getattr(run, name)
    if name == "SourceFile":
        from preclint.source.sourcefile import SourceFile

        return SourceFile
    raise AttributeError(name)
