"""Snapshots of what each rule example reports (ruff's insta habit, in a few dozen lines).

A rule's examples already say *whether* it fires; the snapshot pins *what* it says: per example, each
finding of the rule with its node, module, op, severity, message, precisions and predicted figures
(as findings print them: three digits). One JSON file a rule, ``tests/snapshots/<CODE>.json``. A
change in a message or a number fails the test with the difference; after a deliberate change,
``python -m pytest tests/test_rule_examples.py tests/test_source_rules.py --update-snapshots``
rewrites the entries the run compared, and the diff of the snapshot files is the review.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Iterable, List

from preclint.core.findings import Finding, sci

SNAPSHOTS = Path(__file__).resolve().parent / "snapshots"


def finding_record(finding: Finding) -> Dict[str, Any]:
    """What a snapshot pins of a finding. A graph finding's location is left out (an example model's
    lines move whenever its rule's module is edited); a source finding's is the snippet's own."""
    predicted = {
        mode: {key: sci(value) for key, value in (("rel_error", figure.rel_error), ("max_abs_error", figure.max_abs_error),
                                                   ("flip_fraction", figure.flip_fraction)) if value is not None}
        for mode, figure in sorted(finding.predicted.items())
    }
    record = {"node": finding.node, "module": finding.module, "op": finding.op, "severity": finding.severity,
              "message": finding.message, "precisions": list(finding.precisions), "predicted": predicted}
    if not finding.node and finding.location is not None and finding.location.line:
        record["at"] = f"{finding.location.line}:{finding.location.column}"
    return record


def snapshot_path(code: str) -> Path:
    return SNAPSHOTS / f"{code}.json"


def read_snapshot(code: str) -> Dict[str, List[Dict[str, Any]]]:
    path = snapshot_path(code)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def assert_matches_snapshot(code: str, key: str, findings: Iterable[Finding], update: bool) -> None:
    """The findings of rule ``code`` on example ``key`` are the snapshot's (or become it, with ``update``)."""
    records = sorted((finding_record(f) for f in findings if f.code == code), key=lambda r: json.dumps(r, sort_keys=True))
    snapshot = read_snapshot(code)
    if update:
        snapshot[key] = records
        SNAPSHOTS.mkdir(exist_ok=True)
        snapshot_path(code).write_text(json.dumps(dict(sorted(snapshot.items())), indent=1, sort_keys=True) + "\n",
                                       encoding="utf-8")
        return
    assert key in snapshot, f"no snapshot of {key} in {snapshot_path(code).name}: run pytest with --update-snapshots"
    assert records == snapshot[key], f"{key} reports otherwise than its snapshot (--update-snapshots after a deliberate change)"
