"""--output-format json: the fixed schema (tests/data/report.schema.json), one document."""
from __future__ import annotations

from typing import Sequence

NAME = "json"
LABEL = "json"
SUMMARY = "The fixed schema (tests/data/report.schema.json), one document"
DOCUMENT = True
ORDER = 30


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import json_format  # lazy: listing the formats (--help) loads no writer

    return json_format.render_many(reports)
