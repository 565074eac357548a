"""`preclint plan --backend inductor`: the verified plan run compiled, and its kept layers looked up
in the compiled graph (plan/compiled_check.py)."""
import json

import jsonschema
import pytest

from preclint.cli import main
from tests.paths import DATA, ROOT

SCHEMA = json.loads((DATA / "plan.schema.json").read_text())
MODELS = ROOT / "tests" / "models" / "compiled_effects.py"


@pytest.mark.slow
def test_a_kept_norm_stays_float32_in_the_compiled_graph(capsys, tmp_path):
    policy = tmp_path / "plan.json"
    policy.write_text(json.dumps({"precision": "bf16", "keep": [{"module": "norm", "op": None}]}))
    code = main(["plan", str(MODELS), "--model", "FusedNorm", "--input-shape", "32,64", "--precision", "bf16",
                 "--rtol", "0.5", "--atol", "0.1", "--device", "cpu", "--policy", str(policy), "--backend", "inductor",
                 "--output-format", "json", "-q"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    measured = doc["measured"]
    assert measured["compiled"]["finite"] and measured["compiled"]["rel_error"] > 0
    assert measured["compiled_meets"] is True and "compiled with inductor" in measured["compiled_how"]
    (kept,) = [a for a in measured["compiled_audit"] if a["what"] == "the plan's kept module 'norm'"]
    assert kept["holds"] and kept["compiled_ops"] >= 3, kept
    # apply_policy's float32 forward enters autocast through a context Dynamo does not trace: a graph break
    assert measured["compilation"]["graph_breaks"] >= 1
    assert any("kept module 'norm'" in n and "stays float32 in the compiled graph" in n for n in doc["notes"])
