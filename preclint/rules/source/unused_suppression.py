"""PCL500 unused-suppression: a suppression comment that silences nothing."""
from __future__ import annotations

from typing import Sequence

from preclint.core.findings import Finding, Location
from preclint.rules.base import SourceRule


class UnusedSuppression(SourceRule):
    code = "PCL500"
    name = "unused-suppression"
    summary = "A `# preclint: ignore[...]` or `# noqa: PCL...` comment silences no finding."
    severity = "info"
    # Reported by the suppression pass (preclint.source.suppress), which sees every rule's findings;
    # the per-file rule loop skips it.
    after_suppressions = True
    reports_unused_suppressions = True
    why = """
A suppression that no longer matches a finding hides the next real one on that line, and it tells
readers that a precision problem is there when it is gone. Codes in the comment that name no rule
(a typo, a renumbered code) suppress nothing at all. Only codes whose rules ran are judged, so a
graph code such as PCL101 is not called unused by a `--source-only` run; a bare `# noqa` is shared
with flake8 and Ruff and never reported.

A suppression on a line that holds a bidirectional control character (U+202A-U+202E, U+2066-U+2069,
U+200E, U+200F, U+061C) silences nothing and is reported too: such a character makes the line read
differently in an editor or a review than Python reads it (Trojan Source), so a suppression could
hide behind one.
"""
    example = """
y = torch.ones(3)  # noqa: PCL501   nothing on this line is compared
"""
    fix = """
Remove the code from the comment, or the comment. Keep comments for other tools (`# noqa: E501`) as
they are.
"""
    valid = (
        """
import torch

with torch.cuda.amp.autocast():  # noqa: PCL502
    pass
""",
        """
x = compute()  # noqa
""",
        """
x = compute()  # noqa: E501
""",
    )
    invalid = (
        """
import torch

y = torch.ones(3)  # noqa: PCL501
""",
        """
y = 1  # preclint: ignore[PCL777]
""",
        """
import torch

with torch.autocast("cuda"):  # preclint: ignore[deprecated-amp-api]
    pass
""",
    )

    @classmethod
    def voided_suppression(cls, location: Location, controls: Sequence[str]) -> Finding:
        """A suppression that counts for nothing: its line holds the bidirectional ``controls``."""
        return Finding(
            code=cls.code,
            name=cls.name,
            severity=cls.severity,
            message=(f"Suppression ignored: the line holds {_bidi_characters(controls)}, which make"
                     f"{'' if len(controls) > 1 else 's'} it read differently in an editor or a review than Python "
                     "reads it; it silences nothing."),
            fix="Remove the bidirectional control characters from the line (in a string, write them as escapes: "
                "\"\\u202e\").",
            location=location,
        )

    @classmethod
    def unused_suppression(cls, location: Location, unused: Sequence[str], unknown: Sequence[str]) -> Finding:
        parts = []
        if unused:
            parts.append(f"{', '.join(unused)} found nothing on this line")
        if unknown:
            parts.append(f"{', '.join(unknown)} {'names' if len(unknown) == 1 else 'name'} no preclint rule")
        message = ("Unused suppression: " + "; ".join(parts) + ".") if parts else (
            "Unused suppression: no preclint finding on this line."
        )
        return Finding(
            code=cls.code,
            name=cls.name,
            severity=cls.severity,
            message=message,
            fix="Remove the unused code from the comment, or the comment.",
            location=location,
        )


def _bidi_characters(controls: Sequence[str]) -> str:
    plural = "s" if len(controls) > 1 else ""
    return f"the bidirectional control character{plural} {', '.join(controls)}"
