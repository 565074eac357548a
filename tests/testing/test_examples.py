"""The example suite a user copies (examples/test_models_tf32.py), run as a user runs it: on the CPU,
TF32 emulated, expected outputs recorded on the first run and compared on the next."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.paths import ROOT


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_torchvision_style_suite_passes_under_tf32_and_catches_a_perturbed_weight(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PRECLINT_EXPECTED_DIR": str(tmp_path / "expected"),
           "PRECLINT_EXAMPLE_DEVICE": "cpu", "PRECLINT_EXAMPLE_SIZE": "48"}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                           str(ROOT / "examples" / "test_models_tf32.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "4 passed" in done.stdout, done.stdout[-4000:]
    for case in ("test_expected_output_under_tf32[resnet18]", "test_expected_output_under_tf32[fcn_resnet50]",
                 "test_a_weight_perturbed_by_one_percent_is_caught[resnet18]",
                 "test_a_weight_perturbed_by_one_percent_is_caught[fcn_resnet50]"):
        assert "PASSED" in done.stdout and case in done.stdout, case
    assert sorted(p.name for p in (tmp_path / "expected").iterdir()) == ["fcn_resnet50_48.pt", "resnet18_48.pt"]
