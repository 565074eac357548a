"""`preclint check --probe` and `preclint probe` end to end (CPU emulation), and the rules that only a
probe can fire, run on their own examples."""
import json

import jsonschema
import pytest
import torch

from preclint.cli import main
from preclint.config import Config
from preclint.probe import ProbeOptions, measure_model, merge_into_report, tolerance_of
from preclint.rules import all_rules, graph_rules
from tests.helpers import check_example
from tests.paths import DATA

SCHEMA = json.loads((DATA / "report.schema.json").read_text())



def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_check_with_probe_confirms_or_refutes_findings_in_json(capsys, tiny):
    code, out, err = run(capsys, "check", tiny, "--probe", "cpu", "--output-format", "json", "--exit-zero",
                         "--precision", "tf32,fp16-full", "--rtol", "1e-3", "--atol", "1e-5")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    assert doc["environment"]["emulated"] is True and doc["environment"]["reference"]["dtype"] == "float64"
    assert "nodes" not in doc  # the per-node ledger is `preclint probe`'s
    measured = [f for f in doc["findings"] if "status" in f]
    assert measured, [f["code"] for f in doc["findings"]]
    for f in measured:
        assert f["status"] in ("confirmed", "refuted")
        for mode, figure in f["measured"].items():
            assert {"rel_error", "max_abs_error"} <= set(figure)
    tolerance = [f for f in doc["findings"] if f["code"] == "PCL001"]
    for f in tolerance:
        assert all("min_atol" in figure for figure in f["measured"].values())
    for mode in ("tf32", "fp16-full"):
        assert doc["summary"][mode]["measured_output"]["rel_error"] > 0


@pytest.mark.slow
def test_probe_lists_every_node_with_its_ledger(capsys, tiny):
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--output-format", "json", "--exit-zero",
                         "--precision", "tf32,bf16")
    assert code == 0, err
    doc = json.loads(out)
    jsonschema.validate(doc, SCHEMA)
    names = [row["node"] for row in doc["nodes"]]
    assert len(names) == len(set(names)) >= 7
    for row in doc["nodes"]:
        for mode in ("tf32", "bf16"):
            entry = row["modes"][mode]
            assert {"local", "received", "amplification", "contribution"} <= set(entry), (row["node"], entry)
    convs = {row["module"]: row for row in doc["nodes"] if row["kind"] == "conv"}
    # emulated TF32 follows an H200's kernels: none for the 3-channel stem and the depthwise conv
    assert {m: row["modes"]["tf32"]["tf32_applied"] for m, row in convs.items()} == {"stem": False, "dw": False}
    convs = list(convs.values())
    assert all(row["location"]["line"] > 1 for row in convs)
    assert "gpu" not in doc["environment"] and doc["environment"]["flags"]


@pytest.mark.slow
def test_probe_output_is_deterministic_and_readable(capsys, tiny):
    args = ("probe", tiny, "--device", "cpu", "--exit-zero", "--precision", "fp16", "--color", "never")
    _, first, _ = run(capsys, *args)
    _, second, _ = run(capsys, *args)
    assert first == second
    assert "Measured per layer under fp16" in first
    assert "emulated" in first


@pytest.mark.slow
def test_ablate_reports_the_agreement_of_contributions(capsys, tiny):
    code, out, err = run(capsys, "probe", tiny, "--device", "cpu", "--ablate", "--output-format", "json",
                         "--exit-zero", "--precision", "bf16")
    assert code == 0, err
    doc = json.loads(out)
    assert any("contributions against one-node-at-a-time runs" in note for note in doc["notes"])
    ablated = [row["modes"]["bf16"]["ablation"] for row in doc["nodes"] if "ablation" in row["modes"]["bf16"]]
    assert len(ablated) >= 4


@pytest.mark.parametrize("argv, message", [
    (["--ablate"], "--ablate"),
    (["--probe", "cpu", "--no-run"], "--no-run"),
])
def test_bad_probe_flags_are_one_line_errors(capsys, tiny, argv, message):
    code, out, err = run(capsys, "check", tiny, *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err


def test_probe_cuda_without_a_gpu_is_one_line_and_exit_2(capsys, tiny):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, out, err = run(capsys, "check", tiny, "--probe", "cuda")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--probe cpu" in err and "Traceback" not in err


def test_pcl900_is_documented():
    rules = all_rules()
    assert "PCL900" in rules
    doc = rules["PCL900"].documentation()
    for section in ("Why it matters", "Example", "Fix"):
        assert section in doc


PROBE_RULES = [rule for rule in graph_rules() if rule.needs_probe]
CASES = [
    pytest.param(rule, kind, example, id=f"{rule.code}-{kind}-{i}")
    for rule in PROBE_RULES
    for kind, examples in (("bad", rule.probe_bad), ("good", rule.probe_good))
    for i, example in enumerate(examples)
]


@pytest.mark.slow
@pytest.mark.parametrize("rule, kind, example", CASES)
def test_probe_rule_examples(rule, kind, example):
    report, graph, ctx = check_example(example)
    module, inputs = example.build()
    tolerance = tolerance_of(ctx.rtol, ctx.atol)
    backend = example.options.get("backend", "eager")
    result = measure_model(module, inputs, graph, ctx.modes, ProbeOptions(device="cpu", backend=backend), tolerance)
    merge_into_report(report, ctx, result, Config(precisions=ctx.modes))
    found = [f for f in report.findings if f.code == rule.code]
    if kind == "bad":
        assert found, [f.code for f in report.findings]
        assert all(f.status == "confirmed" and f.measured and f.precisions for f in found)
    else:
        assert not found, [f.message for f in found]
