"""One comparison: one relative error (measure.compare.relative_rms), one error record
(core.findings.ErrorFigure), one tolerance type (measure.compare.Tolerance), and public classes
named apart, so that two figures of one quantity cannot disagree and a reader never has to ask
which ``Tolerance`` is meant."""
import ast
import collections
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]

# public classes that share a name, and why they still do
SHARED_NAMES = {
    "Report": "report/document.Report is the document every output format reads; preclint.Report (api.py) is "
              "what users hold, a view over it",
}

# sqrt(sum d^2 / sum r^2) written out, other than in relative_rms: each place and why it is not that routine
RELATIVE_RMS = re.compile(r"sqrt\(\s*sq\w*\s*/\s*\w+\)|sq\w*\s*\*\*\s*0\.5\s*/")
OWN_RATIO = {
    "preclint/measure/compare.py": "relative_rms itself",
    "preclint/probe/readback.py": "on the device: norms the sweep issued, read back once per pass, no tensors here",
    "preclint/probe/ablate.py": "an injected error's size against the output error, not a run against a reference",
    "preclint/probe/noise.py": "the run-to-run floor: NaN in both runs is not deterministic there, a changed "
                               "integer output is infinite noise",
    "benchmarks/plan_anchors.py": "numpy outputs of ONNX Runtime, compared without torch",
}


def public_classes():
    found = collections.defaultdict(list)
    for path in sorted((ROOT / "preclint").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                found[node.name].append(str(path.relative_to(ROOT)))
    return found


def test_no_two_public_classes_share_a_name():
    shared = {name: paths for name, paths in public_classes().items() if len(paths) > 1}
    assert set(shared) == set(SHARED_NAMES), shared


def test_the_scanner_sees_each_public_class_once_per_module():
    classes = public_classes()
    assert classes["ErrorFigure"] == ["preclint/core/findings.py"]
    assert classes["Tolerance"] == ["preclint/measure/compare.py"]


def test_the_relative_error_is_computed_in_one_routine():
    found = set()
    for folder in ("preclint", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            if RELATIVE_RMS.search(path.read_text()):
                found.add(str(path.relative_to(ROOT)))
    assert found == set(OWN_RATIO), found ^ set(OWN_RATIO)
