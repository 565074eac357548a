"""--output-format gitlab: GitLab Code Quality issues."""
from __future__ import annotations

from typing import Sequence

NAME = "gitlab"
LABEL = "gitlab (Code Quality)"
SUMMARY = "GitLab Code Quality issues"
DOCUMENT = True
ORDER = 70


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import gitlab  # lazy: listing the formats (--help) loads no writer

    return gitlab.render_many(reports)
