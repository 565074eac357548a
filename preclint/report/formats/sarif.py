"""--output-format sarif: SARIF 2.1.0 for GitHub code scanning and other SARIF tools."""
from __future__ import annotations

from typing import Sequence

NAME = "sarif"
LABEL = "sarif"
SUMMARY = "SARIF 2.1.0 for GitHub code scanning and other SARIF tools"
DOCUMENT = True
ORDER = 40


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import sarif  # lazy: listing the formats (--help) loads no writer

    return sarif.render_many(reports)
