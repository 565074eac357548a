"""--output-format github: GitHub Actions workflow commands: annotations on the pull request's files."""
from __future__ import annotations

from typing import Sequence

NAME = "github"
LABEL = "github"
SUMMARY = "GitHub Actions workflow commands: annotations on the pull request's files"
DOCUMENT = False
ORDER = 50


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import github  # lazy: listing the formats (--help) loads no writer

    return github.render_many(reports)
