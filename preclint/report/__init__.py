"""Output formats. Each module converts the one Report into one format; nothing else does.

A run over several models prints one output: one JSON, SARIF, rdjson, GitLab or JUnit document, one
set of GitHub annotations, one text report. A model that could not be checked is a Report with an ``error``; the
document formats carry it, the text formats leave it to the error line on stderr. What users name
(paths, modules, messages quoting them) stays raw in the Report; each format escapes it for its sink
through report.escape.
"""
from __future__ import annotations

from typing import Sequence

from preclint.config import OUTPUT_FORMATS as FORMATS  # one list, which the config validates
from preclint.report.document import Report, review_place

__all__ = ["FORMATS", "Report", "render", "render_reports", "review_place"]



def _format_module(fmt: str):
    if fmt == "json":
        from preclint.report import json_format as module
    elif fmt == "full":
        from preclint.report import console as module
    elif fmt == "concise":
        from preclint.report import concise as module
    elif fmt == "sarif":
        from preclint.report import sarif as module
    elif fmt == "github":
        from preclint.report import github as module
    elif fmt == "rdjson":
        from preclint.report import rdjson as module
    elif fmt == "gitlab":
        from preclint.report import gitlab as module
    elif fmt == "junit":
        from preclint.report import junit as module
    elif fmt == "html":
        from preclint.report import html as module
    else:
        raise ValueError(fmt)
    return module


def render(report: Report, fmt: str, color: bool = False) -> str:
    """The report in format ``fmt`` as one string (deterministic: same input, same bytes)."""
    return render_reports([report], fmt, color)


def render_reports(reports: Sequence[Report], fmt: str, color: bool = False) -> str:
    """The reports of one run (one per model) as one output in format ``fmt``."""
    module = _format_module(fmt)
    return module.render_many(reports, color=color) if fmt == "full" else module.render_many(reports)
