"""Every output format renders one fixed run (a checked model with findings, predictions, a probe's
ledger, notes and a caveat, beside a model that could not be checked) to the bytes it rendered when
the formats became one module each (the digests in tests/data/formats/digests.json): a change to how
formats are found or dispatched changes no output. A deliberate change to a format's output
rewrites the digests: ``PYTHONPATH=. python -m tests.report.test_format_outputs``."""
from __future__ import annotations

import hashlib
import json
import os

import pytest

from preclint.core.notes import Note
from preclint import __version__
from preclint.core.findings import ErrorFigure, Finding, Location
from preclint.report import render_reports
from tests.helpers import finding
from tests.paths import DATA

DIGESTS = DATA / "formats" / "digests.json"
# every format the command line offers, and the full report once more in colour
RENDERINGS = [("full", False), ("full", True), ("concise", False), ("json", False), ("sarif", False),
              ("github", False), ("rdjson", False), ("gitlab", False), ("junit", False), ("html", False)]
SOURCE = "import torch\nwith torch.cuda.amp.autocast():\n    y = model(x)\n"


def checked() -> "Report":  # noqa: F821 - the Report of preclint.report
    from preclint.report import Report

    overflow = Finding(
        "PCL101", "fp16-overflow", "error", "layer1.conv overflows fp16.", "Scale the input.",
        location=Location("pkg/m.py", 3, 9), precisions=("fp16", "bf16"), module="layer1.conv", op="conv2d",
        predicted={"fp16": ErrorFigure(rel_error=float("inf"), max_abs_error=2.5),
                   "bf16": ErrorFigure(rel_error=3.1e-3, max_abs_error=0.02)},
        related=((Location("pkg/m.py", 2, 1), "built here"),),
    )
    overflow.measured = {"fp16": ErrorFigure(rel_error=float("inf"), max_abs_error=None)}
    overflow.status = "confirmed"
    refuted = Finding("PCL201", "low-precision-reduction", "warning", "head.sum reduces in bf16.", "Sum in float32.",
                      location=Location("pkg/m.py", 3, 5), precisions=("bf16",), module="head", op="sum",
                      predicted={"bf16": ErrorFigure(rel_error=4e-3, max_abs_error=None)})
    refuted.status = "refuted"
    tolerance = Finding("PCL001", "output-tolerance", "warning", "The output misses rtol=1e-3.", "Loosen it.",
                        precisions=("bf16",))
    summary = {mode: {"predicted_output": {"rel_error": error, "max_abs_error": 0.0016, "finite": True},
                      "measured_output": {"rel_error": error * 1.5, "max_abs_error": 0.002, "finite": True},
                      "top_layers": [{"module": "layer1.conv (Conv2d)", "node": "conv", "share": 0.75},
                                     {"module": "head (Linear)", "node": "head", "share": 0.25}]}
               for mode, error in (("fp16", 4.4e-4), ("bf16", 3.5e-3))}
    modes = {"fp16": (2e-4, 3e-4), "bf16": (1.6e-3, 2.5e-3)}
    ledger = [{"node": name, "module": module, "op": op, "kind": kind, "label": f"{module} ({op[3:]})",
               "location": {"path": "pkg/m.py", "line": line, "column": 9},
               "modes": {mode: {"dtype": "float32", "local": {"rel_error": local * scale, "max_abs_error": 1e-3},
                                "received": {"rel_error": received * scale, "max_abs_error": 2e-3},
                                "amplification": 1.2, "contribution": share, "tf32_applied": None}
                         for mode, (local, received) in modes.items()}}
              for name, module, op, kind, line, scale, share in (
                  ("conv", "layer1.conv", "nn.Conv2d", "conv", 3, 1.0, 0.75),
                  ("head", "head", "nn.Linear", "linear", 4, 0.5, 0.25))]
    profile = [{"node": row["node"], "module": row["module"], "op": row["op"], "kind": row["kind"],
                "location": row["location"],
                "modes": {mode: {"local": local, "received": received, "share": row["modes"][mode]["contribution"]}
                          for mode, (local, received) in modes.items()}} for row in ledger]
    return Report(
        findings=[overflow, refuted, tolerance, finding(fixable=True), finding("PCL504", 1, 1)],
        model="pkg/m.py", capture="fx", precisions=("fp16", "bf16"), summary=summary,
        notes=[Note("reference", "the reference ran in float64 on the CPU")], caveats=["output[1] is constant: its error says nothing"],
        files=["pkg/m.py"], tolerance={"rtol": 1e-3, "atol": 1e-5},
        environment={"device": "cpu", "torch": "2.x", "emulated": True}, ledger=ledger, profile=profile, ledger_top=5,
    )


def failed() -> "Report":  # noqa: F821
    from preclint.report import Report

    return Report(model="pkg/broken.py", error="pkg/broken.py: no model found (define build_model)")


def renderings() -> dict:
    reports = [checked(), failed()]
    out = {}
    for fmt, color in RENDERINGS:
        text = render_reports(reports, fmt, color=color).replace(__version__, "VERSION")
        out[f"{fmt}{'-color' if color else ''}"] = hashlib.sha256(text.encode("utf-8")).hexdigest()
    return out


@pytest.fixture
def project(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(SOURCE)
    monkeypatch.delenv("GITHUB_WORKSPACE", raising=False)
    monkeypatch.delenv("CI_PROJECT_DIR", raising=False)
    return tmp_path


def test_every_format_renders_the_bytes_it_rendered_before(project):
    expected = json.loads(DIGESTS.read_text())
    got = renderings()
    assert sorted(got) == sorted(expected)
    changed = [name for name in got if got[name] != expected[name]]
    assert not changed, f"these formats render other bytes than before: {changed}"


if __name__ == "__main__":  # rewrite the digests after a deliberate change to a format's output
    import tempfile

    with tempfile.TemporaryDirectory() as where:
        os.environ.pop("GITHUB_WORKSPACE", None)
        os.environ.pop("CI_PROJECT_DIR", None)
        os.chdir(where)
        os.mkdir("pkg")
        with open("pkg/m.py", "w") as f:
            f.write(SOURCE)
        digests = renderings()
    DIGESTS.write_text(json.dumps(digests, indent=2, sort_keys=True) + "\n")
    print(f"wrote {DIGESTS}")
