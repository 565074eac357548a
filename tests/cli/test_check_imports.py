"""What a model's check imports: nothing of the source side's parser (libcst, a third of a second on
two cores) where no file is parsed, as a check of a library's model parses none; and nothing of the
probe, its distributed strategies or the plan, which a check without --probe does not use (each module
a check imports is paid for at every run, compiled afresh where no bytecode is written)."""
import json
import os
import subprocess
import sys

import pytest

from tests.paths import ROOT

_CHECK = """
import sys
from preclint.cli import main
code = main(["check", "torchvision.models:resnet18", "--input-shape", "1,3,32,32", "--output-format", "json",
             "--exit-zero"])
print(repr(sorted(name for name in sys.modules if name == "libcst" or name.startswith("preclint.rules.source."))),
      file=sys.stderr)
print(repr(sorted(name for name in sys.modules if name in ("preclint.probe", "preclint.plan.command")
                  or name.startswith(("preclint.probe.", "preclint.measure.")))), file=sys.stderr)
sys.exit(code)
"""


@pytest.fixture(scope="module")
def imported():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", _CHECK], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)  # the report was written
    return proc.stderr.strip().splitlines()[-2:]


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_library_models_check_imports_no_source_parser(imported):
    assert imported[0] == "[]"


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_check_without_probe_imports_no_probe_nor_plan(imported):
    assert imported[1] == "[]"
