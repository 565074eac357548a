"""The one finding model. Every output format converts from it at the boundary."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional

SEVERITIES = ("info", "warning", "error")
# an absolute path on another Windows drive (display_path's "D:/..."), not a name with a ":" in it
_DRIVE = re.compile(r"[A-Za-z]:[/\\]")


def severity_rank(severity: str) -> int:
    return SEVERITIES.index(severity)


@dataclass(frozen=True, order=True)
class Location:
    """A place in a file. ``line`` and ``column`` are 1-based; columns count code points.

    ``library``: the file belongs to an installed library (torchvision, transformers), and ``path``
    is relative to the directory it is imported from (``torchvision/models/resnet.py``), not to the
    working directory: it names the same file on every machine, but not one of the user's project.
    """

    path: str
    line: int = 1
    column: int = 1
    library: bool = False

    @property
    def in_project(self) -> bool:
        """Whether the place is a file of the project preclint runs in (under the working directory):
        what code review can annotate."""
        return (not self.library and not self.path.startswith(("../", "/")) and self.path != ".."
                and not _DRIVE.match(self.path))

    def as_dict(self) -> dict:
        out = {"path": self.path, "line": self.line, "column": self.column}
        if self.library:
            out["library"] = True
        return out


@dataclass
class ErrorFigure:
    """The error a precision puts on a value, predicted, measured or compared: the one record of it
    for findings, the probe's ledger (a node's local and received error, the output's), the plan's
    before and after, and a comparison of a run's outputs (measure.compare).

    ``rel_error`` is RMS(error) / RMS(reference value) (measure.compare.relative_rms); ``max_abs_error``
    the largest absolute error over the elements. ``flip_fraction``: the fraction of decisions that
    changed, where there are any. Measured figures (a probe) may also carry the smallest
    ``min_rtol``/``min_atol`` the measured output passes with (PCL001) and the ``status`` the
    measurement gave the finding in this mode. ``finite``: whether the values stayed finite, and
    ``failing_fraction`` the fraction of elements outside atol + rtol |ref|, where they were judged.
    """

    rel_error: Optional[float] = None
    max_abs_error: Optional[float] = None
    flip_fraction: Optional[float] = None
    min_rtol: Optional[float] = None
    min_atol: Optional[float] = None
    status: Optional[str] = None
    finite: Optional[bool] = None
    failing_fraction: Optional[float] = None

    def as_dict(self) -> dict:
        out = {"rel_error": self.rel_error, "max_abs_error": self.max_abs_error}
        for key in ("flip_fraction", "min_rtol", "min_atol", "status", "finite", "failing_fraction"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        return out


@dataclass
class Finding:
    code: str
    name: str
    severity: str
    message: str
    fix: str
    location: Optional[Location] = None
    precisions: tuple = ()
    module: str = ""
    op: str = ""
    predicted: dict = field(default_factory=dict)  # mode -> ErrorFigure
    measured: dict = field(default_factory=dict)  # mode -> ErrorFigure (after a probe)
    status: Optional[str] = None  # "confirmed" | "refuted" after a probe
    related: tuple = ()  # (Location, str) pairs: e.g. the line that builds the module
    fixable: bool = False
    node: str = ""  # the IR node the finding is about ("" for model-level findings): what a probe measures

    def sort_key(self):
        loc = self.location or Location("")
        return (loc.path, loc.line, loc.column, self.code, self.module, self.message)


def sci(value) -> str:
    """A number as findings print it: three significant digits, scientific when small or large."""
    if value is None:
        return "n/a"
    value = float(value)
    if value != value:
        return "nan"
    if value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    if 1e-3 <= abs(value) < 1e4:
        return f"{value:.3g}"
    return f"{value:.2e}"


def percent(fraction: float) -> str:
    if fraction >= 0.1:
        return f"{fraction * 100:.0f}%"
    if fraction >= 0.001:
        return f"{fraction * 100:.1f}%"
    return f"{fraction * 100:.2g}%"
