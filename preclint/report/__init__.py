"""Output formats. Each is one module of ``formats/``, found there (formats/__init__.py says what it
declares); a writer converts the one Report into its format, and nothing else does.

A run over several models prints one output: one JSON, SARIF, rdjson, GitLab or JUnit document, one
set of GitHub annotations, one text report. A model that could not be checked is a Report with an ``error``; the
document formats carry it, the text formats leave it to the error line on stderr. What users name
(paths, modules, messages quoting them) stays raw in the Report; each format escapes it for its sink
through report.escape.
"""
from __future__ import annotations

from typing import Sequence

from preclint.report.document import Report, review_place
from preclint.report.formats import format_named, names

__all__ = ["FORMATS", "Report", "render", "render_reports", "review_place"]

FORMATS = names()  # every module of preclint/report/formats/, in listing order


def render(report: Report, fmt: str, color: bool = False) -> str:
    """The report in format ``fmt`` as one string (deterministic: same input, same bytes)."""
    return render_reports([report], fmt, color)


def render_reports(reports: Sequence[Report], fmt: str, color: bool = False) -> str:
    """The reports of one run (one per model) as one output in format ``fmt``."""
    return format_named(fmt).render_many(reports, color=color)
