"""--output-format rdjson: reviewdog's Diagnostic Format, for review comments."""
from __future__ import annotations

from typing import Sequence

NAME = "rdjson"
LABEL = "rdjson (reviewdog)"
SUMMARY = "The Diagnostic Format of reviewdog, for review comments on the changed lines"
DOCUMENT = True
ORDER = 60


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import rdjson  # lazy: listing the formats (--help) loads no writer

    return rdjson.render_many(reports)
