"""One Config from [tool.preclint] in pyproject.toml and the command-line flags (flags win)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from preclint.numerics import DEFAULT_MODES


@dataclass
class Config:
    select: Optional[List[str]] = None  # None: every rule that is on by default
    ignore: List[str] = field(default_factory=list)
    extend_select: List[str] = field(default_factory=list)
    precisions: Tuple[str, ...] = DEFAULT_MODES
    rtol: Optional[float] = None
    atol: Optional[float] = None
    fail_on: str = "warning"
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    exclude: List[str] = field(default_factory=list)
    output_format: str = "full"

    def is_selected(self, code: str) -> bool:
        """Ruff's precedence: the longest matching selector decides; ignore beats select on a tie."""
        selectors = (self.select if self.select is not None else ["ALL"]) + self.extend_select
        best_select = max((len(s) for s in selectors if _matches(s, code)), default=-1)
        best_ignore = max((len(s) for s in self.ignore if _matches(s, code)), default=-1)
        return best_select >= 0 and best_select > best_ignore


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)
