"""Baselines: adopt preclint on existing code by accepting today's findings and failing only on new ones.

``--write-baseline FILE`` records the findings of a run; ``--baseline FILE`` drops the findings that
match a record. A record is keyed on the path, the code, and a fingerprint of what the finding is
about — the text of its line with whitespace normalised, plus the module and op of a graph finding —
never on the line number, so code that moves up or down keeps matching. A graph finding on a line of
an installed library (``torchvision/models/resnet.py``, a path the same on every machine) is keyed
without that line's text, which changes with the library's version. Records carry a count: two
identical lines with the same finding need two records, and a third copy is new. The fingerprint is
report.fingerprint's, the one SARIF and GitLab Code Quality carry too (with an occurrence index where
the baseline has its count); it has not changed since version 1, so every baseline written reads.
"""
from __future__ import annotations

from collections import Counter
from typing import Iterable, List, Tuple

from preclint.core.errors import UserError
from preclint.core.findings import Finding
from preclint.report.escape import json_text
from preclint.report.fingerprint import content_fingerprint, finding_path, normalised_line
from preclint.report.output import write_output_file
from preclint.text.safe_io import load_json, TooDeep

FORMAT = "preclint-baseline"
VERSION = 1
MAX_SIZE = 64 << 20  # some 300,000 findings


def finding_key(finding: Finding) -> Tuple[str, str, str]:
    """What a baseline knows a finding by: its file, its code and its fingerprint."""
    return finding_path(finding), finding.code, content_fingerprint(finding)


def write_baseline(findings: Iterable[Finding], filename: str) -> int:
    """Record ``findings`` in ``filename``; returns how many were recorded."""
    findings = list(findings)
    counts = Counter(finding_key(f) for f in findings)
    lines = {}
    for f in findings:
        lines.setdefault(finding_key(f), normalised_line(f) or f.module or f.name)
    records = [
        {"path": path, "code": code, "fingerprint": fp, "count": counts[(path, code, fp)], "text": lines[(path, code, fp)]}
        for path, code, fp in sorted(counts)
    ]
    document = {"format": FORMAT, "version": VERSION, "findings": records}
    # (json_text: a path or module name with a lone surrogate is written as JSON's escape of it)
    write_output_file(filename, json_text(document, indent=2) + "\n", "baseline")
    return len(findings)


def read_baseline(filename: str) -> Counter:
    """The records of the baseline ``filename``: a regular file of at most ``MAX_SIZE`` bytes (a FIFO
    or a link to /dev/zero, which git can commit, is refused at once), or a UserError."""

    try:
        document = load_json(filename, MAX_SIZE)
    except OSError as exc:
        raise UserError(f"{filename}: cannot read the baseline: {exc.strerror or exc}") from None
    except TooDeep as exc:
        raise UserError(f"{filename}: not a preclint baseline (its JSON is {exc})") from None
    except ValueError as exc:
        raise UserError(f"{filename}: not a preclint baseline (invalid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise UserError(f"{filename}: not a preclint baseline (write one with --write-baseline)")
    if document.get("version") != VERSION:
        raise UserError(f"{filename}: baseline version {document.get('version')!r} is not supported (expected {VERSION})")
    records = document.get("findings")
    if not isinstance(records, list):
        raise UserError(f"{filename}: not a preclint baseline (its findings are not a list)")
    counts: Counter = Counter()
    for number, record in enumerate(records, 1):
        counts[_record_key(record, filename, number)] += _record_count(record, filename, number)
    return counts


def _record_key(record, filename: str, number: int) -> Tuple[str, str, str]:
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in ("path", "code", "fingerprint")):
        raise UserError(f"{filename}: baseline record {number} lacks path, code or fingerprint")
    return record["path"], record["code"], record["fingerprint"]


def _record_count(record: dict, filename: str, number: int) -> int:
    count = record.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UserError(f"{filename}: baseline record {number} has count {count!r}; expected a whole number >= 1")
    return count


def filter_baseline(findings: Iterable[Finding], filename: str) -> Tuple[List[Finding], int]:
    """(findings not in the baseline, number of baseline records that matched nothing: fixed since)."""
    remaining = read_baseline(filename)
    kept = []
    for finding in sorted(findings, key=Finding.sort_key):
        key = finding_key(finding)
        if remaining[key] > 0:
            remaining[key] -= 1
        else:
            kept.append(finding)
    stale = sum(count for count in remaining.values() if count > 0)
    return kept, stale
