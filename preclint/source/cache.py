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
over the old one, so a reader sees one complete version or none. Two runs at once each write what
they know and the last one wins: at worst some files are checked again next time.

Safe against whoever else can write there (a shared ``PRECLINT_CACHE_DIR``, a CI cache restored from
another branch): the directories preclint makes are its own (``preclint.text.safe_io.PrivateDirectory``),
and a cache file that is a link, a special file or another user's is neither read nor written (the run
goes without a cache, and says so). A cache file is believed only when it reads back as exactly what
preclint writes: its format, the settings it was written for, and every field of every entry (codes
of the rules that ran with their names, known severities and precisions, lines and columns inside the
file they are about); anything else counts as empty, with a note. A cache is no signature: whoever
can write the file can still claim a file's bytes are clean, so a run that must not trust the cache
directory passes ``--no-cache``.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import sys
from typing import Dict, List, Optional, Sequence, Tuple

from preclint.core.findings import SEVERITIES, Finding, Location
from preclint.core.notes import Note
from preclint.core.numerics import BF16, FP16, FP32, MODES, TF32
from preclint.rules import installed_pack_rules, all_rules, unreadable_file_rule
from preclint.source.suppress import Directive
from preclint import __version__
from preclint.text.safe_io import NotOurs, PrivateDirectory, TooLarge

FORMAT = 4
MAX_SIZE = 256 << 20  # a project of a million files; a larger file is not read
PRECISIONS = frozenset(MODES) | {f.name for f in (FP32, TF32, FP16, BF16)}
_DIGEST = re.compile(r"[0-9a-f]{32}")
_MAX_POSITION = 1 << 31


class Invalid(ValueError):
    """A cache file or entry that does not read back as what preclint writes."""


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

    parts = [f"format={FORMAT}", f"preclint={__version__}", f"python={platform.python_version()}",
             f"libcst={getattr(libcst, '__version__', '') or _libcst_version()}", "codes=" + ",".join(sorted(codes))]
    packs = sorted({f"{rule.__module__}:{_version_of(rule)}" for rule in installed_pack_rules()})
    if packs:  # a rule pack's new version can find other things in an unchanged file
        parts.append("packs=" + ",".join(packs))
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


def _version_of(rule) -> str:
    """Where ``rule``'s module lies, its size and when it changed: a pack's edit or new version changes them."""
    path = getattr(sys.modules.get(rule.__module__), "__file__", None) or ""
    try:
        info = os.stat(path)
    except OSError:
        return "unknown"
    return f"{path}:{info.st_size}:{info.st_mtime_ns}"


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


def _position(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value < _MAX_POSITION


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _check_finding(record, names: Dict[str, str]) -> None:
    """That ``record`` is a finding as ``_encode`` writes it, of one of the rules in ``names`` (code ->
    name): a bogus severity would crash the report, an unknown code show a finding no rule made."""
    if not (isinstance(record, list) and len(record) == 9):
        raise Invalid("a finding is not a record of 9 fields")
    code, name, severity, message, fix, line, column, precisions, fixable = record
    if not isinstance(code, str) or code not in names:
        raise Invalid(f"a finding of the code {code!r}, which no rule of this run has")
    if name != names[code]:
        raise Invalid(f"a finding of {code} named {name!r}")
    if severity not in SEVERITIES:
        raise Invalid(f"a finding of the severity {severity!r}")
    if not (isinstance(message, str) and isinstance(fix, str)):
        raise Invalid("a finding whose message or fix is not text")
    if not (_position(line) and _position(column) and isinstance(fixable, bool)):
        raise Invalid("a finding whose line, column or fixable flag is not one")
    if not (_strings(precisions) and set(precisions) <= PRECISIONS):
        raise Invalid(f"a finding of the precisions {precisions!r}")


def _check_directive(record) -> None:
    if not (isinstance(record, list) and len(record) == 6):
        raise Invalid("a suppression is not a record of 6 fields")
    line, column, kind, codes, unknown, bidi = record
    if not (_position(line) and _position(column) and kind in ("noqa", "preclint") and _strings(codes)
            and _strings(unknown) and _strings(bidi)):
        raise Invalid("a suppression whose line, column, kind or codes are not one")


def _check_entry(path, entry, names: Dict[str, str]) -> None:
    if not (isinstance(path, str) and os.path.isabs(path)):
        raise Invalid("an entry not keyed by an absolute path")
    if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str) and entry[0]
            and isinstance(entry[1], str) and _DIGEST.fullmatch(entry[1])
            and isinstance(entry[2], list) and isinstance(entry[3], list)):
        raise Invalid("an entry is not [printed path, digest, findings, suppressions]")
    for record in entry[2]:
        _check_finding(record, names)
    for record in entry[3]:
        _check_directive(record)


def _checksum(settings: str, body: bytes) -> str:
    """What the entries hold, as written: an entry edited by hand (a finding removed, a severity
    changed) no longer matches. A checksum, not a signature: whoever writes the file can recompute it."""
    return hashlib.blake2b(settings.encode("ascii") + b"\n" + body, digest_size=16).hexdigest()


_FILES = b'","files":'


def _header(settings: str) -> bytes:
    return b'{"format":%d,"settings":"%s","checksum":"' % (FORMAT, settings.encode("ascii"))


def encode_document(settings: str, files: Dict[str, list]) -> bytes:
    """The bytes ``Cache.save`` writes: a JSON object whose checksum covers the bytes of its files."""
    body = json.dumps(files, separators=(",", ":")).encode("ascii")  # json.dumps escapes the rest
    return _header(settings) + _checksum(settings, body).encode("ascii") + _FILES + body + b"}"


def decode_document(data: bytes, settings: str, names: Dict[str, str]) -> Dict[str, list]:
    """The entries of ``data`` when it is exactly what ``encode_document`` writes for ``settings``
    and the rules ``names`` (code -> name); Invalid, saying what is wrong, otherwise. The checksum is
    checked before the entries are parsed, and every field of every entry after."""
    header = _header(settings)
    if not data.startswith(header):
        raise Invalid("not a preclint cache of this format and these settings")
    start = len(header) + 32 + len(_FILES)
    checksum, body = data[len(header):len(header) + 32], data[start:-1]
    if data[len(header) + 32:start] != _FILES or not data.endswith(b"}"):
        raise Invalid("not a preclint cache of this format and these settings")
    if checksum != _checksum(settings, body).encode("ascii"):
        raise Invalid("its entries do not match its checksum: edited since preclint wrote it")
    try:
        files = json.loads(body.decode("ascii"))
    except (ValueError, RecursionError):
        raise Invalid("its entries are not JSON as preclint writes it") from None
    if not isinstance(files, dict):
        raise Invalid("its files are not a table")
    for path, entry in files.items():
        _check_entry(path, entry, names)
    return files


def _inside(records: list, line_index: int, lines: int, columns: int) -> bool:
    return all(record[line_index] <= lines and record[line_index + 1] <= columns for record in records)


def _decode(record, path: str) -> Finding:
    code, name, severity, message, fix, line, column, precisions, fixable = record
    return Finding(code=code, name=name, severity=severity, message=message, fix=fix,
                   location=Location(path, line, column), precisions=tuple(precisions), fixable=fixable)


def _encode_directive(directive: Directive) -> list:
    return [directive.line, directive.column, directive.kind, list(directive.codes), list(directive.unknown),
            list(directive.bidi)]


def _decode_directive(record) -> Directive:
    line, column, kind, codes, unknown, bidi = record
    return Directive(line, column, kind, tuple(codes), tuple(unknown), tuple(bidi))


Directives = Dict[int, List[Directive]]


def rule_names(codes: Sequence[str]) -> Dict[str, str]:
    """Code -> name of the rules whose findings a cache of a run of ``codes`` can hold: those rules,
    and the one that reports files no rule could check (it reports whatever is selected)."""

    rules = all_rules()
    names = {code: rules[code].name for code in codes if code in rules}
    unreadable = unreadable_file_rule()
    names[unreadable.code] = unreadable.name
    return names


class Cache:
    """The cache of one project root and settings; ``save()`` writes it back if anything changed.
    ``notes`` say why a cache file was not used."""

    def __init__(self, directory: Optional[Tuple[str, Sequence[str]]] = None, name: str = "",
                 entries: Optional[Dict[str, list]] = None, settings: str = "",
                 names: Optional[Dict[str, str]] = None):
        self.directory = directory  # (base, parts below it); None: not written
        self.name = name
        self.settings = settings
        self.names = names or {}  # code -> name of the rules whose findings it may hold
        # abspath -> [printed path, digest, [finding records], [directive records]]
        self.entries: Dict[str, list] = entries or {}
        self.hits = 0
        self.misses = 0
        self.notes: List[Note] = []
        self.mismatched = 0  # entries whose positions lie outside their file
        self._changed = False

    @property
    def filename(self) -> str:
        return os.path.join(self.directory[0], *self.directory[1], self.name) if self.directory else ""

    @classmethod
    def open(cls, project_root: str, codes: Sequence[str]) -> "Cache":
        """The cache for ``project_root`` and ``codes``: empty (and noted) when its file cannot be
        trusted; not written either when its directory or file is not preclint's own."""

        root_key = hashlib.blake2b(os.path.abspath(project_root).encode("utf-8", "surrogateescape"),
                                   digest_size=10).hexdigest()
        settings = settings_key(codes)
        cache = cls((cache_directory(), (f"v{FORMAT}", root_key)), settings + ".json", settings=settings,
                    names=rule_names(codes))
        try:
            with PrivateDirectory(*cache.directory) as directory:
                data = directory.read(cache.name, MAX_SIZE)
        except NotOurs as exc:
            cache.directory = None
            cache.notes.append(Note("cache", f"cache: {exc}; the cache is not used in this run (remove it to use it again)"))
            return cache
        except TooLarge as exc:
            cache.notes.append(Note("cache", f"cache: {exc}; it is ignored and rewritten"))
            return cache
        except OSError:  # no cache directory to be had (a read-only home): a run without a cache
            cache.directory = None
            return cache
        if data is None:
            return cache
        try:
            cache.entries = decode_document(data, settings, cache.names)
        except Invalid as exc:
            cache.notes.append(Note("cache", f"cache: {cache.filename} does not hold what preclint writes ({exc}); "
                                             "it is ignored and rewritten"))
        return cache

    def get(self, filename: str, printed: str, digest: str,
            text: Optional[str] = None) -> Optional[Tuple[List[Finding], Directives]]:
        """The file's raw findings and suppression directives, if stored for these bytes and path;
        with the file's ``text``, only if every position stored lies inside it."""
        entry = self.entries.get(os.path.abspath(filename))
        if entry is not None and entry[0] == printed and entry[1] == digest:
            if text is None or self._fits(entry, text):
                findings = [_decode(record, printed) for record in entry[2]]
                directives: Directives = {}
                for record in entry[3]:
                    directive = _decode_directive(record)
                    directives.setdefault(directive.line, []).append(directive)
                self.hits += 1
                return findings, directives
            self.mismatched += 1
        self.misses += 1
        return None

    def _fits(self, entry: list, text: str) -> bool:
        lines = max(text.count("\n"), text.count("\r")) + 1
        columns = len(text) + 1
        return _inside(entry[2], 5, lines, columns) and _inside(entry[3], 0, lines, columns)

    def put(self, filename: str, printed: str, digest: str, findings: Sequence[Finding], directives: Directives) -> None:
        records = [_encode_directive(d) for line in sorted(directives) for d in directives[line]]
        entry = [printed, digest, [_encode(f) for f in findings], records]
        try:  # what the next run would not believe is not stored (a rule's finding of an unknown precision)
            _check_entry(os.path.abspath(filename), entry, self.names)
        except Invalid:
            return
        self.entries[os.path.abspath(filename)] = entry
        self._changed = True

    def save(self) -> None:
        """Write the cache; a cache that cannot be written is no error (a read-only home, a full disk)."""
        if self.mismatched:
            self.notes.append(Note("cache", f"cache: {self.mismatched} entr{'ies' if self.mismatched != 1 else 'y'} in "
                                            f"{self.filename} point outside their files (not what preclint writes); "
                                            "those files were checked again"))
        if not self._changed or self.directory is None:
            return

        data = encode_document(self.settings, self.entries)
        try:
            with PrivateDirectory(*self.directory) as directory:
                directory.write(self.name, data)
        except NotOurs as exc:
            self.notes.append(Note("cache", f"cache: {exc}; the cache was not written"))
        except OSError:
            pass
