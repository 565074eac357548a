"""Fingerprints that survive edits: what a review system and a baseline know a finding by.

A finding is known by what it is about, never by its line number: its rule code, the text of the
line it points at with whitespace normalised (for a graph finding, also the module and op it is
about; for a model-level finding, the rule's name), and its file. Lines inserted or deleted above a
finding, and re-indentation, leave its fingerprint as it was; editing the flagged line itself gives
a new one, as it should (the finding may be about new code). The neighbouring lines are not part of
it: an edit next to a finding says nothing about the finding, and would re-open it. A graph finding
on a line of an installed library (``torchvision/models/resnet.py``, a path that is the same on every
machine) is known by its path, module and op: the library's text changes with its version, not with
the user's code.

Two findings alike in all of that (the same call on two identical lines of one file) are told apart
by an occurrence index, counted in the order findings are sorted (path, line, column, code), so that
the fingerprints of a run are unique, as GitLab requires (it shows one issue per fingerprint).

One definition serves every consumer: :func:`content_fingerprint` is what the baseline records
(beside the path, with a count in place of the occurrence index; unchanged since the baseline's
first version, so baselines written before keep matching), and :func:`stable_fingerprints` gives
the per-finding identities of SARIF's ``partialFingerprints`` and GitLab Code Quality's
``fingerprint``.
"""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import List, Sequence

from preclint.core.findings import Finding
from preclint.text.lines import line_text

SARIF_KEY = "preclintFingerprint/v1"  # the partialFingerprints entry (SARIF: a name, then its version)


def fingerprint_bytes(text: str) -> bytes:
    """The bytes a fingerprint hashes for ``text``, for any string: UTF-8, a name that is not UTF-8
    (os.fsdecode's surrogate escapes) as its own bytes, as fingerprints have always been made; any
    other lone surrogate (a module named ``"\\ud800"``), which no file name decodes to, as its UTF-8
    form (surrogatepass)."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def normalised_line(finding: Finding) -> str:
    """The text of the finding's line with runs of whitespace as one space; "" for a finding without
    a place in the user's files (model-level) or on a library's line."""
    if finding.location is None or finding.location.library:
        return ""
    text = line_text(finding.location.path, finding.location.line)
    return " ".join((text or "").split())


def content_fingerprint(finding: Finding) -> str:
    """What the finding is about, without its file and its position: 16 hex digits."""
    parts = [finding.code, normalised_line(finding), finding.module, finding.op]
    if finding.location is None and not finding.module and not finding.op:
        parts.append(finding.name)  # a model-level finding: one per code and model
    return hashlib.sha256(fingerprint_bytes("\x1f".join(parts))).hexdigest()[:16]


def finding_path(finding: Finding) -> str:
    return finding.location.path if finding.location is not None else ""


def stable_fingerprints(findings: Sequence[Finding]) -> List[str]:
    """One fingerprint for each of ``findings`` (in their order), unique within them: the file, the
    content fingerprint and the occurrence index among the findings alike in both. 32 hex digits."""
    keys = [(finding_path(f), content_fingerprint(f)) for f in findings]
    seen: Counter = Counter()
    occurrence = [0] * len(findings)
    for i in sorted(range(len(findings)), key=lambda i: findings[i].sort_key()):
        occurrence[i] = seen[keys[i]]
        seen[keys[i]] += 1
    return [
        hashlib.sha256(fingerprint_bytes(f"{path}\x1f{content}\x1f{n}")).hexdigest()[:32]
        for (path, content), n in zip(keys, occurrence)
    ]
