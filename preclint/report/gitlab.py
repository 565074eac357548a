"""--output-format gitlab: GitLab Code Quality, for ``artifacts: reports: codequality`` in
``.gitlab-ci.yml``, which GitLab shows in the merge request's widget and diff.

One JSON array of issues, each with the fields GitLab reads: ``description`` (the message),
``check_name`` (the rule code), ``fingerprint`` (report.fingerprint: stable across runs and edits
above the finding, unique in the report, as GitLab shows one issue per fingerprint),
``severity`` (error: major, warning: minor, info: info) and ``location`` with ``path`` and
``lines.begin``. Paths are relative to the working directory, as preclint prints them; when the job
runs in a subdirectory of the checkout (``CI_PROJECT_DIR``, which GitLab sets), they are made
relative to the checkout, where GitLab looks for them, as Ruff does.

GitLab can only place an issue on a file of the repository: a finding on a library's line is placed
on the user's line that calls into the library or builds the model (report.review_place), naming the
library's line in its description; a finding without a place in the project (model-level) goes on
line 1 of the model's file. A finding the probe refuted is not an issue and is left out. A model that
could not be checked is a ``blocker`` issue, and a caveat (a vacuous check) an ``info`` one, on its
model. Messages and paths carry the raw names (JSON holds any text; report.escape.json_text).
"""
from __future__ import annotations

import hashlib
import os
import posixpath
from collections import Counter
from typing import Dict, List, Sequence

from preclint.report.document import Report, failure_line, is_refuted, moved_note, review_place
from preclint.report.escape import json_text
from preclint.report.fingerprint import fingerprint_bytes, stable_fingerprints

SEVERITIES = {"error": "major", "warning": "minor", "info": "info"}


def project_path(path: str) -> str:
    """``path`` (relative to the working directory) relative to ``CI_PROJECT_DIR`` when the working
    directory is inside it; as it is otherwise."""
    root = os.environ.get("CI_PROJECT_DIR")
    if not root or os.path.isabs(path):
        return path
    try:
        prefix = os.path.relpath(os.getcwd(), root)
    except (OSError, ValueError):  # no working directory, or another drive
        return path
    if prefix == "." or prefix == ".." or prefix.startswith(".." + os.sep):
        return path
    return posixpath.normpath(posixpath.join(prefix.replace(os.sep, "/"), path))


def _issue(description: str, check_name: str, fingerprint: str, severity: str, path: str, line: int) -> dict:
    return {
        "description": description,
        "check_name": check_name,
        "fingerprint": fingerprint,
        "severity": severity,
        "location": {"path": project_path(path), "lines": {"begin": max(1, line)}},
    }


def _model_file(report: Report) -> str:
    """The file of the report's model ("path/model.py" of "path/model.py:Net"); a model named as
    package.module:attr has no file of its own, and its name is the nearest there is."""
    model = report.model or ""
    head = model.rpartition(":")[0]
    return head if head and os.path.isfile(head) else model


def _finding_issue(finding, fingerprint: str, model_file: str) -> dict:
    primary, _ = review_place(finding)
    description = finding.message.strip() + moved_note(finding, primary)  # the raw names, as in JSON
    path, line = (primary.path, primary.line) if primary is not None else (model_file, 1)
    return _issue(description, finding.code, fingerprint, SEVERITIES.get(finding.severity, "minor"), path, line)


class _OwnFingerprints:
    """The fingerprints of preclint's own issues (a model not checked, a caveat): from what the issue
    is, its model's file and the model's name where it is more than the file (``net.py:Encoder`` and
    ``net.py:Decoder`` failing are two issues), and an occurrence index for one alike in all of that
    (the same model named twice), so that they are unique in the report and stable across runs."""

    def __init__(self) -> None:
        self.seen: Counter = Counter()

    def __call__(self, kind: str, report: Report, *more: str) -> str:
        model = _model_file(report)
        parts = [kind, model] + ([report.model] if report.model and report.model != model else []) + list(more)
        key = tuple(parts)
        if self.seen[key]:
            parts.append(str(self.seen[key]))
        self.seen[key] += 1
        return hashlib.sha256(fingerprint_bytes("\x1f".join(parts))).hexdigest()[:32]


def issues(reports: Sequence[Report]) -> List[dict]:
    """The Code Quality issues of a run, model by model in the order they were named."""
    checked = [r for r in reports if r.error is None]
    pairs = [(f, report) for report in checked for f in report.sorted_findings() if not is_refuted(f)]
    by_report: Dict[int, List[dict]] = {}
    for (finding, report), fingerprint in zip(pairs, stable_fingerprints([f for f, _ in pairs])):
        by_report.setdefault(id(report), []).append(_finding_issue(finding, fingerprint, _model_file(report)))
    out: List[dict] = []
    own = _OwnFingerprints()
    for report in reports:
        model = _model_file(report)
        if report.error is not None:
            out.append(_issue(failure_line(report), "preclint/model-not-checked",
                              own("model-not-checked", report), "blocker", model, 1))
            continue
        out += by_report.get(id(report), [])
        out += [_issue(" ".join(caveat.split()), "preclint/caveat", own("caveat", report, caveat),
                       "info", model, 1) for caveat in report.caveats]
    return out


def render(report: Report) -> str:
    return render_many([report])


def render_many(reports: Sequence[Report]) -> str:
    return json_text(issues(reports), indent=2, allow_nan=False) + "\n"
