"""--output-format html: one self-contained page with the numbers as charts (needs --output)."""
from __future__ import annotations

from typing import Sequence

NAME = "html"
LABEL = "html (a page for the browser: use --output)"
SUMMARY = "One self-contained page with the numbers as charts (needs `--output`)"
DOCUMENT = True
ORDER = 90


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import html  # lazy: listing the formats (--help) loads no writer

    return html.render_many(reports)
