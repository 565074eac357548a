"""The source-only check's cache: a file whose bytes, printed path, preclint and settings have not
changed is not parsed again (Ruff's cache, keyed by content rather than modification time).

Where it lives: ``$PRECLINT_CACHE_DIR``, else the user's cache directory (``$XDG_CACHE_HOME/preclint``,
``~/.cache/preclint``), one file per project root and settings. Not inside the checked project: a
repository could ship a ``.preclint_cache`` that claims its files are clean, and a run on an untrusted
pull request must not believe it; nor does the cache then need ignoring, or write into a checkout.

What is stored for a file: the raw findings of the source rules that ran (before per-file-ignores,
suppressions and baselines, which are applied on every run) and the suppression directives those
need (``preclint.source.suppress.file_directives``: a warm run neither reads nor tokenizes a file for
its comments), keyed by the file's absolute path, its printed path (rules read it: tests and scripts
are judged differently) and a hash of its bytes.

The settings key covers what else decides those findings: preclint's version and the size and
modification time of its own source files (an edited rule invalidates the cache), libcst's and
Python's versions (CPython's parser judges files first), and the rules selected.

Safe against corruption and concurrent runs: the cache is written whole, to a temporary file renamed
over the old one, so a reader sees one complete version or none; anything that does not read back as
expected (truncated, garbage, another format) counts as empty. Two runs at once each write what they
know and the last one wins: at worst some files are checked again next time.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from preclint.core.findings import Finding, Location
from preclint.source.suppress import Directive

FORMAT = 2


def cache_directory() -> str:
    explicit = os.environ.get("PRECLINT_CACHE_DIR")
    if explicit:
        return explicit
    if sys.platform == "win32":
        base = os.environ.get("LOCALAPPDATA") or os.path.expanduser("~")
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "preclint")


def content_digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16).hexdigest()


def settings_key(codes: Sequence[str]) -> str:
    """A hash of everything besides a file that decides its raw findings."""
    import libcst

    from preclint import __version__

    parts = [f"format={FORMAT}", f"preclint={__version__}", f"python={platform.python_version()}",
             f"libcst={getattr(libcst, '__version__', '') or _libcst_version()}", "codes=" + ",".join(sorted(codes))]
    # every module of the package: the source rules, the text layer they read files with, this command
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for directory, folders, names in os.walk(package):
        folders.sort()
        for name in sorted(names):
            if name.endswith(".py"):
                try:
                    info = os.stat(os.path.join(directory, name))
                except OSError:
                    continue
                parts.append(f"{os.path.relpath(os.path.join(directory, name), package)}:{info.st_size}:{info.st_mtime_ns}")
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=12).hexdigest()


def _libcst_version() -> str:
    try:
        from libcst._version import __version__ as version

        return version
    except ImportError:
        return "unknown"


def _encode(finding: Finding) -> list:
    loc = finding.location or Location("")
    return [finding.code, finding.name, finding.severity, finding.message, finding.fix, loc.line, loc.column,
            list(finding.precisions), finding.fixable]


def _decode(record, path: str) -> Finding:
    code, name, severity, message, fix, line, column, precisions, fixable = record
    for value in (code, name, severity, message, fix):
        if not isinstance(value, str):
            raise ValueError("not a finding")
    if not (isinstance(line, int) and isinstance(column, int) and isinstance(fixable, bool)):
        raise ValueError("not a finding")
    if not (isinstance(precisions, list) and all(isinstance(p, str) for p in precisions)):
        raise ValueError("not a finding")
    return Finding(code=code, name=name, severity=severity, message=message, fix=fix,
                   location=Location(path, line, column), precisions=tuple(precisions), fixable=fixable)


def _encode_directive(directive: Directive) -> list:
    return [directive.line, directive.column, directive.kind, list(directive.codes), list(directive.unknown)]


def _decode_directive(record) -> Directive:
    line, column, kind, codes, unknown = record
    if not (isinstance(line, int) and isinstance(column, int) and kind in ("noqa", "preclint")):
        raise ValueError("not a directive")
    if not (isinstance(codes, list) and isinstance(unknown, list) and all(isinstance(c, str) for c in codes + unknown)):
        raise ValueError("not a directive")
    return Directive(line, column, kind, tuple(codes), tuple(unknown))


Directives = Dict[int, List[Directive]]


class Cache:
    """The cache of one project root and settings; ``save()`` writes it back if anything changed."""

    def __init__(self, filename: Optional[str], entries: Optional[Dict[str, list]] = None):
        self.filename = filename
        # abspath -> [printed path, digest, [finding records], [directive records]]
        self.entries: Dict[str, list] = entries or {}
        self.hits = 0
        self.misses = 0
        self._changed = False

    @classmethod
    def open(cls, project_root: str, codes: Sequence[str]) -> "Cache":
        root_key = hashlib.blake2b(os.path.abspath(project_root).encode("utf-8", "surrogateescape"),
                                   digest_size=10).hexdigest()
        filename = os.path.join(cache_directory(), f"v{FORMAT}", root_key, settings_key(codes) + ".json")
        return cls(filename, _load(filename))

    def get(self, filename: str, printed: str, digest: str) -> Optional[Tuple[List[Finding], Directives]]:
        """The file's raw findings and suppression directives, if stored for these bytes and path."""
        entry = self.entries.get(os.path.abspath(filename))
        if entry is not None and entry[0] == printed and entry[1] == digest:
            try:
                findings = [_decode(record, printed) for record in entry[2]]
                directives: Directives = {}
                for record in entry[3]:
                    directive = _decode_directive(record)
                    directives.setdefault(directive.line, []).append(directive)
            except (ValueError, TypeError):
                findings = None
            if findings is not None:
                self.hits += 1
                return findings, directives
        self.misses += 1
        return None

    def put(self, filename: str, printed: str, digest: str, findings: Sequence[Finding], directives: Directives) -> None:
        records = [_encode_directive(d) for line in sorted(directives) for d in directives[line]]
        self.entries[os.path.abspath(filename)] = [printed, digest, [_encode(f) for f in findings], records]
        self._changed = True

    def save(self) -> None:
        """Write the cache; a cache that cannot be written is no error (a read-only home, a full disk)."""
        if not self._changed or self.filename is None:
            return
        from preclint.text.safe_io import write_atomic

        document = {"format": FORMAT, "files": self.entries}
        try:
            os.makedirs(os.path.dirname(self.filename), exist_ok=True)
            write_atomic(self.filename, json.dumps(document, separators=(",", ":")))
        except OSError:
            pass


def _load(filename: str) -> Dict[str, list]:
    from preclint.text.safe_io import read_regular

    try:
        document = json.loads(read_regular(filename).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):
        return {}
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(document.get("files"), dict):
        return {}
    return {
        path: entry for path, entry in document["files"].items()
        if isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str) and isinstance(entry[1], str)
        and isinstance(entry[2], list) and isinstance(entry[3], list)
    }
