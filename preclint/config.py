"""One Config from [tool.preclint] in pyproject.toml and the command-line flags (flags win).

Discovery follows Ruff's closest-file model: walk up from the working directory to the first
pyproject.toml that has a ``[tool.preclint]`` table and read that one; parents are not merged. Keys
are kebab-case, as in Ruff:

    [tool.preclint]
    select = ["PCL"]                 # codes or prefixes, or "ALL"
    ignore = ["PCL504"]
    extend-select = ["PCL500"]
    precisions = ["tf32", "fp16"]
    rtol = 1e-3
    atol = 1e-5
    max-flip = 0.01                  # `preclint plan`: fraction of decisions allowed to change
    fail-on = "warning"              # info | warning | error
    exclude = ["third_party/", "tests/data/**"]
    force-exclude = true             # exclude files named on the command line too (pre-commit)
    output-format = "concise"
    timeout = 600                    # seconds for one model (0: no limit)

    [tool.preclint.per-file-ignores]
    "tests/**" = ["PCL501"]

Patterns in ``exclude`` and ``per-file-ignores`` are relative to the directory of the file that
holds them. As in Ruff, ``exclude`` applies to the directories walked; a file named on the command
line is checked all the same, unless ``force-exclude`` (``--force-exclude``) is set, as a pre-commit
hook needs (it names every staged file). Unknown keys and unknown codes are errors (exit 2), never
silently ignored.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterable, List, Optional, Tuple

from preclint.core.errors import UserError
from preclint.core.findings import SEVERITIES
from preclint.core.numerics import DEFAULT_MODES, MODES, scaling_value
from preclint.report.formats import names as output_formats
from preclint.rules import all_rules
from preclint.text.globs import compiled, GlobError
from preclint.text.paths import glob_match
from preclint.text.safe_io import read_regular

# Seconds one model may take (import, build, capture, reference pass, probe) before preclint gives up on
# it: minutes for the largest models preclint runs on a CPU, and a bound on a model file that never
# returns, so a pre-commit hook or a CI job ends with a message instead of hanging.
DEFAULT_TIMEOUT = 600.0


@dataclass
class Config:
    select: Optional[List[str]] = None  # None: every rule that is on by default
    ignore: List[str] = field(default_factory=list)
    extend_select: List[str] = field(default_factory=list)
    precisions: Tuple[str, ...] = DEFAULT_MODES
    rtol: Optional[float] = None
    atol: Optional[float] = None
    max_flip: Optional[float] = None  # `preclint plan`'s decision budget
    fail_on: str = "warning"
    per_file_ignores: Dict[str, List[str]] = field(default_factory=dict)
    exclude: List[str] = field(default_factory=list)
    force_exclude: bool = False  # exclude applies to files named on the command line too
    output_format: str = "full"
    timeout: float = DEFAULT_TIMEOUT  # seconds per model; 0: no limit
    # the scaled formats' recipe options (numerics.SCALING_OPTIONS): [tool.preclint.scaling], --scaling
    scaling: Dict[str, Any] = field(default_factory=dict)
    path: Optional[str] = None  # the configuration file read, if any
    root: Optional[str] = None  # where relative patterns start: the config file's directory (else cwd)

    def is_selected(self, code: str) -> bool:
        """Ruff's precedence: the longest matching selector decides; ignore beats select on a tie."""
        selectors = (self.select if self.select is not None else ["ALL"]) + self.extend_select
        best_select = max((len(s) for s in selectors if _matches(s, code)), default=-1)
        best_ignore = max((len(s) for s in self.ignore if _matches(s, code)), default=-1)
        return best_select >= 0 and best_select > best_ignore

    def is_ignored_explicitly(self, code: str) -> bool:
        """An ``ignore`` selector names ``code`` (for findings shown unless the user says otherwise)."""
        return any(_matches(s, code) for s in self.ignore)

    def ignored_for_file(self, path: str, code: str) -> bool:
        """Whether ``per-file-ignores`` drops ``code`` in ``path`` (a path as printed)."""
        if not self.per_file_ignores:
            return False
        rel = self._relative(path)

        return any(
            glob_match(pattern, rel) and any(_matches(s, code) for s in codes)
            for pattern, codes in self.per_file_ignores.items()
        )

    def _relative(self, path: str) -> str:
        root = self.root or os.getcwd()
        absolute = os.path.abspath(path)
        try:
            rel = os.path.relpath(absolute, root)
        except ValueError:
            return absolute.replace(os.sep, "/")
        return rel.replace(os.sep, "/")

    def with_flags(
        self,
        select: Optional[Iterable[str]] = None,
        ignore: Optional[Iterable[str]] = None,
        extend_select: Optional[Iterable[str]] = None,
        **values: Any,
    ) -> "Config":
        """This configuration with command-line flags applied; None means "flag not given".

        As in Ruff, a ``--select`` on the command line starts the selection afresh (the file's
        select and ignore no longer apply); ``--ignore`` and ``--extend-select`` add to what is there.
        """
        changes: Dict[str, Any] = {k: v for k, v in values.items() if v is not None}
        if select is not None:
            changes["select"] = list(select)
            changes["ignore"] = list(ignore or [])
            changes["extend_select"] = list(extend_select or [])
        else:
            if ignore is not None:
                changes["ignore"] = self.ignore + list(ignore)
            if extend_select is not None:
                changes["extend_select"] = self.extend_select + list(extend_select)
        if "precisions" in changes:
            changes["precisions"] = tuple(changes["precisions"])
        if "scaling" in changes:  # flags add to (and override) the file's options
            changes["scaling"] = {**self.scaling, **changes["scaling"]}
        config = dataclasses.replace(self, **changes)
        config.validate("command line")
        return config

    def validate(self, where: str) -> None:
        """Raise UserError on a value preclint cannot use (``where`` names its origin in the message)."""
        for key, selectors in (("select", self.select or []), ("ignore", self.ignore), ("extend-select", self.extend_select)):
            check_selectors(selectors, f"{where}: {key}")
        for pattern, codes in self.per_file_ignores.items():
            check_selectors(codes, f"{where}: per-file-ignores[{pattern!r}]")
        if self.select is not None or self.ignore:
            self._check_something_selected(where)
        for key, patterns in (("exclude", self.exclude), ("per-file-ignores", list(self.per_file_ignores))):
            for pattern in patterns:
                check_glob(pattern, f"{where}: {key}")
        if not self.precisions:
            raise UserError(f"{where}: precisions names no precision (choose from {', '.join(MODES)})")
        for mode in self.precisions:
            if mode not in MODES:
                raise UserError(f"{where}: unknown precision {mode!r} (known: {', '.join(MODES)})")
        for key in ("rtol", "atol", "timeout"):
            value = getattr(self, key)
            if value is not None and not _is_finite_non_negative(value):
                raise UserError(f"{where}: {key} must be a finite number >= 0, not {value!r}")
        if self.max_flip is not None and not (_is_finite_non_negative(self.max_flip) and self.max_flip <= 1):
            raise UserError(f"{where}: max-flip must be a fraction from 0 to 1, not {self.max_flip!r}")
        for option, value in self.scaling.items():
            try:
                scaling_value(option, value)
            except ValueError as exc:
                raise UserError(f"{where}: {exc}") from None
        if self.fail_on not in SEVERITIES:
            raise UserError(f"{where}: fail-on must be one of {', '.join(SEVERITIES)}, not {self.fail_on!r}")
        if self.output_format not in output_formats():
            raise UserError(
                f"{where}: output-format must be one of {', '.join(output_formats())}, not {self.output_format!r}"
            )


    def _check_something_selected(self, where: str) -> None:
        if not any(self.is_selected(code) for code in known_codes()):
            what = "select names no rule" if self.select == [] and not self.extend_select else \
                "the selection (select, ignore, extend-select) leaves no rule to run"
            raise UserError(f"{where}: {what}; give rule codes or prefixes, or ALL (see `preclint rule --all`)")


def _is_finite_non_negative(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def check_glob(pattern: str, where: str) -> None:
    """A pattern of ``exclude`` or ``per-file-ignores`` that preclint can match; else a UserError."""

    try:
        compiled(pattern.strip().replace(os.sep, "/").strip("/"))
    except GlobError as exc:
        raise UserError(f"{where}: invalid glob {pattern!r}: {exc.msg}") from None


def _matches(selector: str, code: str) -> bool:
    return selector == "ALL" or code.startswith(selector)


_SELECTOR = re.compile(r"^[A-Z]+[0-9]*$")  # PCL, PCL1, PCL101; an installed pack's ACME, ACME001


def known_codes() -> List[str]:
    return sorted(all_rules())


def check_selectors(selectors: Iterable[str], where: str) -> None:
    """Every selector is ``ALL`` or a code or prefix of at least one rule; else a UserError."""
    codes = None
    for selector in selectors:
        if not isinstance(selector, str):
            raise UserError(f"{where}: expected rule codes, got {selector!r}")
        if selector == "ALL":
            continue
        if codes is None:
            codes = known_codes()
        if not _SELECTOR.match(selector) or not any(code.startswith(selector) for code in codes):
            raise UserError(f"{where}: unknown rule code or prefix {selector!r} (see `preclint rule --all`)")


# --- the configuration file -------------------------------------------------------------------

def _strings(value: Any, key: str, where: str) -> List[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise UserError(f"{where}: {key} must be a list of strings")
    return list(value)


def _number(value: Any, key: str, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{where}: {key} must be a number")
    try:
        return float(value)
    except OverflowError:  # a TOML integer of hundreds of digits
        raise UserError(f"{where}: {key} must be a finite number >= 0, not an integer that large") from None


def _boolean(value: Any, key: str, where: str) -> bool:
    if not isinstance(value, bool):
        raise UserError(f"{where}: {key} must be true or false")
    return value


def _string(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise UserError(f"{where}: {key} must be a string")
    return value


def _table_of_lists(value: Any, key: str, where: str) -> Dict[str, List[str]]:
    if not isinstance(value, dict):
        raise UserError(f"{where}: {key} must be a table of glob = [codes]")
    return {str(pattern): _strings(codes, f"{key}[{pattern!r}]", where) for pattern, codes in value.items()}


# key in the file -> (Config field, converter that checks the value's type)
KEYS = {
    "select": ("select", _strings),
    "ignore": ("ignore", _strings),
    "extend-select": ("extend_select", _strings),
    "precisions": ("precisions", lambda v, k, w: tuple(_strings(v, k, w))),
    "rtol": ("rtol", _number),
    "atol": ("atol", _number),
    "max-flip": ("max_flip", _number),
    "fail-on": ("fail_on", _string),
    "per-file-ignores": ("per_file_ignores", _table_of_lists),
    "exclude": ("exclude", _strings),
    "force-exclude": ("force_exclude", _boolean),
    "output-format": ("output_format", _string),
    "timeout": ("timeout", _number),
    "scaling": ("scaling", lambda v, k, w: dict(v) if isinstance(v, dict) else _not_a_table(k, w)),
}


def _not_a_table(key: str, where: str):
    raise UserError(f"{where}: {key} must be a table of option = value (see docs/fp8.md)")


MAX_SIZE = 16 << 20  # a configuration larger than this is no configuration


def _load_toml(path: str) -> Dict[str, Any]:
    try:  # a FIFO or a link to /dev/zero is refused at once, not read for ever
        data = read_regular(path, max_size=MAX_SIZE)
    except OSError as exc:
        raise UserError(f"{path}: cannot read the configuration: {exc.strerror or exc}") from None
    if sys.version_info >= (3, 11):
        import tomllib as toml
    else:  # pragma: no cover - exercised on Python 3.9/3.10 only
        try:
            import tomli as toml
        except ImportError:
            if re.search(rb"^\s*\[\s*tool\s*\.\s*preclint\b", data, re.MULTILINE):
                raise UserError(
                    f"{path}: reading [tool.preclint] needs Python 3.11 or the tomli package (pip install tomli)"
                ) from None
            return {}
    try:
        return toml.loads(data.decode("utf-8"))
    except (toml.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: invalid TOML: {exc}") from None
    except RecursionError:  # tomllib recurses once a nested array or inline table
        raise UserError(f"{path}: invalid TOML: its arrays or tables nest too deeply") from None


def _table(path: str) -> Optional[Dict[str, Any]]:
    """The ``[tool.preclint]`` table of a pyproject.toml, or None when it has none."""
    tool = _load_toml(path).get("tool", {})
    table = tool.get("preclint") if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise UserError(f"{path}: [tool.preclint] must be a table")
    return table


def find_config(start: Optional[str] = None) -> Optional[str]:
    """The closest pyproject.toml with a [tool.preclint] table, from ``start`` (default: cwd) up."""
    directory = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate) and _table(candidate) is not None:
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def config_from_file(path: str) -> Config:
    """A Config from one file: a pyproject.toml (its [tool.preclint] table) or a TOML file whose top
    level holds the same keys (``--config preclint.toml``)."""
    if os.path.basename(path) == "pyproject.toml":
        table = _table(path) or {}
    else:
        table = _load_toml(path)
        tool = table.get("tool")
        if isinstance(tool, dict) and isinstance(tool.get("preclint"), dict):
            table = tool["preclint"]
    shown = os.path.relpath(path) if not os.path.isabs(path) else path
    values: Dict[str, Any] = {}
    for key, value in table.items():
        if key not in KEYS:
            close = [k for k in KEYS if k.replace("-", "_") == key or k == key.replace("_", "-")]
            hint = f"; did you mean {close[0]!r}?" if close else f" (known: {', '.join(KEYS)})"
            raise UserError(f"{shown}: [tool.preclint] unknown key {key!r}{hint}")
        attribute, convert = KEYS[key]
        values[attribute] = convert(value, key, f"{shown}: [tool.preclint]")
    config = Config(**values, path=os.path.abspath(path), root=os.path.dirname(os.path.abspath(path)))
    config.validate(f"{shown}: [tool.preclint]")
    return config


def load_config(start: Optional[str] = None, config_file: Optional[str] = None, isolated: bool = False) -> Config:
    """The configuration a run uses before flags: ``config_file`` if given, else the closest
    pyproject.toml with [tool.preclint] from ``start`` (default: cwd) up, else the defaults.
    ``isolated`` ignores every configuration file."""
    if isolated:
        return Config()
    if config_file is not None:
        if os.path.isdir(config_file):
            raise UserError(f"{config_file}: is a directory; expected a TOML file (pyproject.toml)")
        if not os.path.exists(config_file):
            raise UserError(f"{config_file}: no such configuration file")
        return config_from_file(config_file)
    found = find_config(start)
    return config_from_file(found) if found else Config()
