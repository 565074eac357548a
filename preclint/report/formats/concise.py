"""--output-format concise: one line a finding, `path:line:col: CODE message`."""
from __future__ import annotations

from typing import Sequence

NAME = "concise"
LABEL = "concise"
SUMMARY = "One line a finding, `path:line:col: CODE message`"
DOCUMENT = False
ORDER = 20


def render_many(reports: Sequence, *, color: bool = False) -> str:
    from preclint.report import concise  # lazy: listing the formats (--help) loads no writer

    return concise.render_many(reports)
