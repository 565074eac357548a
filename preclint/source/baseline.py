"""Baselines: adopt preclint on existing code by accepting today's findings and failing only on new ones.

``--write-baseline FILE`` records the findings of a run; ``--baseline FILE`` drops the findings that
match a record. A record is keyed on the path, the code, and a fingerprint of what the finding is
about — the text of its line with whitespace normalised, plus the module and op of a graph finding —
never on the line number, so code that moves up or down keeps matching. A graph finding on a line of
an installed library (``torchvision/models/resnet.py``, a path the same on every machine) is keyed
without that line's text, which changes with the library's version. Records carry a count: two
identical lines with the same finding need two records, and a third copy is new.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from typing import Iterable, List, Tuple

from preclint.errors import UserError
from preclint.findings import Finding
from preclint.source.lines import line_text

FORMAT = "preclint-baseline"
VERSION = 1


def _normalised_line(finding: Finding) -> str:
    # a library's line (torchvision's) is keyed by its path, module and op: its text changes with the
    # library's version, not with the user's code
    if finding.location is None or finding.location.library:
        return ""
    text = line_text(finding.location.path, finding.location.line)
    return " ".join((text or "").split())


def fingerprint(finding: Finding) -> str:
    parts = [finding.code, _normalised_line(finding), finding.module, finding.op]
    if finding.location is None and not finding.module and not finding.op:
        parts.append(finding.name)  # a model-level finding: one per code and model
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


def _key(finding: Finding) -> Tuple[str, str, str]:
    path = finding.location.path if finding.location is not None else ""
    return path, finding.code, fingerprint(finding)


def write_baseline(findings: Iterable[Finding], filename: str) -> int:
    """Record ``findings`` in ``filename``; returns how many were recorded."""
    findings = list(findings)
    counts = Counter(_key(f) for f in findings)
    lines = {}
    for f in findings:
        lines.setdefault(_key(f), _normalised_line(f) or f.module or f.name)
    records = [
        {"path": path, "code": code, "fingerprint": fp, "count": counts[(path, code, fp)], "text": lines[(path, code, fp)]}
        for path, code, fp in sorted(counts)
    ]
    document = {"format": FORMAT, "version": VERSION, "findings": records}
    data = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    directory = os.path.dirname(os.path.abspath(filename))
    if not os.path.isdir(directory):
        raise UserError(f"{filename}: the directory does not exist")
    from preclint.source.fix import write_atomic

    if os.path.exists(filename):
        write_atomic(filename, data)
    else:
        try:
            with open(filename, "w", encoding="utf-8") as out:
                out.write(data)
        except OSError as exc:
            raise UserError(f"{filename}: cannot write the baseline: {exc.strerror}") from None
    return len(findings)


def read_baseline(filename: str) -> Counter:
    try:
        with open(filename, encoding="utf-8") as handle:
            document = json.load(handle)
    except OSError as exc:
        raise UserError(f"{filename}: cannot read the baseline: {exc.strerror}") from None
    except ValueError as exc:
        raise UserError(f"{filename}: not a preclint baseline (invalid JSON: {exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise UserError(f"{filename}: not a preclint baseline (write one with --write-baseline)")
    if document.get("version") != VERSION:
        raise UserError(f"{filename}: baseline version {document.get('version')!r} is not supported (expected {VERSION})")
    counts: Counter = Counter()
    try:
        for record in document["findings"]:
            counts[(record["path"], record["code"], record["fingerprint"])] += int(record.get("count", 1))
    except (KeyError, TypeError, ValueError):
        raise UserError(f"{filename}: a baseline record lacks path, code or fingerprint") from None
    return counts


def filter_baseline(findings: Iterable[Finding], filename: str) -> Tuple[List[Finding], int]:
    """(findings not in the baseline, number of baseline records that matched nothing: fixed since)."""
    remaining = read_baseline(filename)
    kept = []
    for finding in sorted(findings, key=Finding.sort_key):
        key = _key(finding)
        if remaining[key] > 0:
            remaining[key] -= 1
        else:
            kept.append(finding)
    stale = sum(count for count in remaining.values() if count > 0)
    return kept, stale
