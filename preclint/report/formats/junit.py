"""--output-format junit: JUnit XML for the CI systems that show test reports."""
from __future__ import annotations

from typing import Sequence

NAME = "junit"
LABEL = "junit"
SUMMARY = "JUnit XML for the CI systems that show test reports"
DOCUMENT = True
ORDER = 80


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import junit  # lazy: listing the formats (--help) loads no writer

    return junit.render_many(reports)
