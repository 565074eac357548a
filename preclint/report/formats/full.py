"""--output-format full: findings grouped by file, then a table per precision (the default)."""
from __future__ import annotations

from typing import Sequence

NAME = "full"
LABEL = "full (default)"
SUMMARY = "Findings grouped by file, then a table per precision (the default)"
DOCUMENT = False
ORDER = 10


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import console  # lazy: listing the formats (--help) loads no writer

    return console.render_many(reports, color=color)
