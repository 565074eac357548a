"""`preclint plan`: plans for models whose culprit is known, the policy round trip, the JSON
artifact, and bad input."""

import json
import subprocess
import sys

import jsonschema
import pytest
import torch

from preclint.cli import main
from preclint.measure.compare import Tolerance
from preclint.plan.planner import Planner, make_plan
from preclint.plan.units import Unit
from preclint.policy import PolicyError, apply_policy, load_policy, onnx_patterns, Kept
from tests.helpers import check
from tests.models.plan_culprits import Healthy, RMSHead, WideLayer
from tests.paths import DATA, MODELS

MODELS = MODELS / "plan_culprits.py"
SCHEMA = json.loads((DATA / "plan.schema.json").read_text())


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def plan_for(model, inputs, mode, rtol=1e-2, atol=1e-3, max_flip=None):
    report, graph, _ = check(model, inputs, precisions=(mode,))
    return make_plan(graph, mode, Tolerance(rtol, atol, max_flip), "model", report.findings), graph


def keeps(plan):
    return {(k.module, k.op) for k in plan.keep}


def test_an_overflowing_layer_is_kept_and_named_with_its_reason():
    plan, _ = plan_for(WideLayer(), (torch.randn(8, 64),), "fp16")
    assert keeps(plan) == {("big", None)}
    assert plan.keep[0].reason.startswith("overflow")
    assert plan.keep[0].alternative and plan.keep[0].alternative.startswith("PCL101")
    assert not plan.predicted["before"].finite and plan.predicted["after"].finite
    assert plan.meets_tolerance
    assert 0 < plan.kept_flops_fraction < 0.6


def test_a_single_op_is_kept_where_one_op_is_the_culprit():
    plan, _ = plan_for(RMSHead(), (torch.randn(16, 32),), "fp16", atol=1e-2)
    assert keeps(plan) == {("", "mul")}  # the square, not the layers around it
    assert plan.kept_flops_fraction < 0.1


@pytest.mark.slow
def test_a_healthy_model_gets_an_empty_plan():
    plan, _ = plan_for(Healthy(), (torch.randn(2, 3, 16, 16),), "fp16", rtol=1e-2, atol=1e-2)
    assert plan.keep == [] and plan.kept_flops_fraction == 0 and plan.meets_tolerance


def test_a_tight_tolerance_keeps_a_minimal_set_that_meets_it():
    """bfloat16 against atol=1e-3: several layers must go; dropping any one of them fails again."""
    plan, graph = plan_for(WideLayer(), (torch.randn(8, 64),), "bf16")
    assert plan.keep and plan.meets_tolerance
    planner = Planner(graph, __import__("preclint.core.numerics", fromlist=["MODES"]).MODES["bf16"], Tolerance(1e-2, 1e-3))
    kept = {Unit(k.module, k.op) for k in plan.keep}
    assert planner.meets(planner.predict(kept))
    for unit in kept:
        assert not planner.meets(planner.predict(kept - {unit})), unit


def test_values_below_the_formats_range_keep_the_layer_and_the_outputs_in_float32():
    """Outputs around 1e-9 are float16 zeros in a cast model whatever layer runs in float32: only
    returning them in float32 (<outputs>) and keeping the weights unrounded meets atol=1e-12."""
    model = torch.nn.Linear(16, 16)
    with torch.no_grad():
        model.weight.mul_(1e-9)
        model.bias.zero_()
    plan, _ = plan_for(model, (torch.randn(4, 16),), "fp16-full", rtol=1e-2, atol=1e-12)
    # the whole layer, or its op with its weight (plan/conditional.py): either keeps the weights unrounded
    assert keeps(plan) in ({("", None), ("<outputs>", None)},
                           {("", "linear"), ("<param:weight>", None), ("<outputs>", None)}) and plan.meets_tolerance


def test_cast_model_keeps_the_layer_that_reads_a_kept_overflowing_value():
    """fp16-full: the kept layer's float32 result (about 1e5) would overflow where the next float16
    layer casts it down, so that layer (the norm, which brings it back in range) is kept too."""
    plan, _ = plan_for(WideLayer(), (torch.randn(8, 64),), "fp16-full")
    assert keeps(plan) == {("big", None), ("norm", None)}
    assert "float32 input" in next(k.reason for k in plan.keep if k.module == "norm")
    assert plan.predicted["after"].finite and plan.meets_tolerance


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fp16", "fp16-full"])
def test_policy_round_trip_runs_the_kept_layers_in_float32(mode):
    plan, _ = plan_for(WideLayer(), (torch.randn(8, 64),), mode)
    policy = load_policy(json.loads(json.dumps(plan.to_json())))
    model = apply_policy(WideLayer().eval(), policy)
    seen = {}
    for name, module in model.named_modules():
        if name:
            module.register_forward_hook(lambda m, a, out, name=name: seen.update({name: out.dtype}) and None)
    x = torch.randn(8, 64)
    with torch.no_grad():
        if mode == "fp16":
            with torch.autocast("cpu", dtype=torch.float16):
                y = model(x)
        else:
            y = model(x.half())
    reference = WideLayer().eval()(x)
    assert torch.isfinite(y).all()
    assert torch.allclose(y.float(), reference, rtol=1e-2, atol=2e-2)
    kept = {k.module for k in policy.keep}
    if mode == "fp16":
        assert seen["big"] == torch.float32 and seen["fc1"] == torch.float16
    else:
        assert kept == {"big", "norm"}
        assert seen["fc1"] == torch.float16 and seen["big"] == torch.float32 and seen["head"] == torch.float16
        assert model.big.weight.dtype == torch.float32 and model.head.weight.dtype == torch.float16
        assert y.dtype == torch.float16
    copy = __import__("copy").deepcopy(model)  # a copied model keeps the plan
    with torch.no_grad():
        y2 = copy(x) if mode == "fp16" else copy(x.half())
    assert torch.isfinite(y2).all()


def test_a_cast_model_keeps_only_the_kept_layers_parameters_in_float32():
    model = apply_policy(WideLayer().eval(), {"precision": "bf16-full", "keep": [{"module": "norm", "op": None}]})
    assert model.norm.weight.dtype == torch.float32 and model.big.weight.dtype == torch.bfloat16
    seen = {}
    model.norm.register_forward_hook(lambda m, a, out: seen.update(norm=out.dtype) and None)
    with torch.no_grad():
        y = model(torch.randn(8, 64, dtype=torch.bfloat16))
    assert seen["norm"] == torch.float32 and y.dtype == torch.bfloat16  # cast down by the next layer, the output


def test_a_kept_op_runs_in_float32_inside_its_module():
    model = apply_policy(RMSHead().eval(), {"precision": "fp16", "keep": [{"module": "", "op": "mul"}]})
    x = torch.randn(16, 32)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        y = model(x)
        plain = RMSHead().eval()(x)
    with torch.no_grad():
        reference = RMSHead().eval()(x)
    assert torch.allclose(y.float(), reference, atol=1e-2)
    assert not torch.allclose(plain.float(), reference, atol=1e-2)  # without the plan float16 fails


def test_unknown_modules_in_a_policy_are_an_error():
    with pytest.raises(PolicyError, match="'nope'"):
        apply_policy(WideLayer(), {"precision": "fp16", "keep": [{"module": "nope", "op": None}]})
    with pytest.raises(PolicyError, match="precision"):
        load_policy({"precision": "fp8", "keep": []})


@pytest.mark.slow
@pytest.mark.subprocess
def test_importing_the_policy_does_not_import_the_analysis():
    code = ("import sys, preclint.policy; print(sorted(m for m in sys.modules if m.startswith('preclint')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert json.loads(out.replace("'", '"')) == ["preclint", "preclint.policy"]


def test_onnx_patterns_match_both_exporters_names():
    import re

    [module] = onnx_patterns([Kept("layer1.0.conv1")])
    assert re.match(module, "/layer1/layer1.0/conv1/Conv")  # TorchScript exporter
    assert re.match(module, "/layer1/layer1.0/layer1.0.conv1/conv2d_1")  # dynamo exporter's scopes
    assert not re.match(module, "/layer1/layer1.0/conv2/Conv")
    [op] = onnx_patterns([Kept("", "mul")])
    assert re.match(op, "/Mul_3") and re.match(op, "/mul_1") and not re.match(op, "/layer1/Mul")


@pytest.mark.slow
def test_cli_json_plan_is_verified_and_matches_the_schema(capsys, tmp_path):
    code, out, err = run(capsys, "plan", MODELS, "--model", "WideLayer", "--input", "8x64", "--precision", "fp16",
                         "--rtol", "1e-2", "--atol", "1e-3", "--output-format", "json", "--device", "cpu")
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert [k["module"] for k in data["keep"]] == ["big"]
    assert data["measured"]["before"]["finite"] is False and data["measured"]["after"]["finite"] is True
    assert data["meets_tolerance"] is True and data["measured"]["runs"] == 1
    # the artifact is the policy: verified again from the file
    path = tmp_path / "plan.json"
    path.write_text(out)
    code, out, err = run(capsys, "plan", MODELS, "--model", "WideLayer", "--input", "8x64", "--precision", "fp16",
                         "--rtol", "1e-2", "--atol", "1e-3", "--policy", path, "--device", "cpu")
    assert code == 0, err
    assert "big" in out and "meets the tolerance: yes" in out


@pytest.mark.slow
def test_cli_plan_verifies_a_model_that_keeps_tensors_with_history(capsys, tmp_path):
    # the verifier copied the model with copy.deepcopy, which refuses such a tensor: the plan was
    # "not verified", and a --policy file ended in an internal error
    argv = ["plan", MODELS, "--model", "CachedScale", "--input", "8x64", "--precision", "fp16", "--rtol", "1e-2",
            "--atol", "1e-3", "--device", "cpu"]
    code, out, err = run(capsys, *argv, "--output-format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert not any("not verified" in note for note in data["notes"]), data["notes"]
    assert data["measured"]["after"]["finite"] is True and [k["module"] for k in data["keep"]] == ["big"]
    path = tmp_path / "plan.json"
    path.write_text(out)
    code, out, err = run(capsys, *argv, "--policy", path)
    assert code == 0, err
    assert "meets the tolerance: yes" in out


@pytest.mark.slow
def test_cli_decision_budget_keeps_the_layer_that_flips_the_top_class(capsys):
    code, out, err = run(capsys, "plan", MODELS, "--model", "OffsetClassifier", "--input", "256x32", "--precision",
                         "fp16", "--max-flip", "0.01", "--output-format", "json", "--device", "cpu")
    assert code == 0, err
    data = json.loads(out)
    assert [(k["module"], k["reason"].split(":")[0]) for k in data["keep"]] == [("head", "decisions")]
    assert data["predicted"]["before"]["flip_fraction"] > 0.1 and data["measured"]["before"]["flip_fraction"] > 0.1
    assert data["measured"]["after"]["flip_fraction"] <= 0.01 and data["tolerance"]["max_flip"] == 0.01


@pytest.mark.slow
def test_cli_console_shows_the_table_and_the_deployment_forms(capsys):
    code, out, err = run(capsys, "plan", MODELS, "--model", "RMSHead", "--input", "16x32", "--precision", "fp16",
                         "--rtol", "1e-2", "--atol", "1e-2", "--no-verify")
    assert code == 0, err
    assert "overflow" in out and "ONNX nodes_to_exclude" in out
    # the diff wraps the user's own line, which the plan keeps
    assert '+        with torch.autocast("cuda", enabled=False):' in out
    assert "+            var = (h.float() * h.float()).mean(-1, keepdim=True)" in out


@pytest.mark.slow
def test_cli_unknown_module_in_policy_file_exits_2(capsys, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"precision": "fp16", "keep": [{"module": "encoder.missing", "op": None}]}))
    code, out, err = run(capsys, "plan", MODELS, "--model", "WideLayer", "--input", "8x64", "--precision", "fp16",
                         "--rtol", "1e-2", "--atol", "1e-3", "--policy", path, "--no-verify")
    assert code == 2 and "encoder.missing" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_a_tolerance_float32_cannot_meet_exits_2(capsys):
    code, out, err = run(capsys, "plan", MODELS, "--model", "Healthy", "--input", "2x3x16x16", "--precision", "fp16",
                         "--rtol", "0", "--atol", "1e-12", "--no-verify")
    assert code == 2 and "float32 itself" in err and "no plan can meet it" in err


@pytest.mark.parametrize("argv, message", [
    (["--precision", "fp16"], "needs the tolerance"),
    (["--precision", "tf32", "--atol", "1e-3"], "one --precision"),
    (["--precision", "fp16,bf16", "--atol", "1e-3"], "one --precision"),
])
def test_cli_usage_errors_exit_2(capsys, argv, message):
    code, out, err = run(capsys, "plan", MODELS, "--model", "Healthy", "--input", "2x3x16x16", *argv)
    assert code == 2 and message in err


@pytest.mark.slow
def test_cli_html_plan_goes_to_the_output_file_with_its_table(capsys, tmp_path):
    page = tmp_path / "plan.html"
    code, out, err = run(capsys, "plan", MODELS, "--model", "RMSHead", "--input", "16x32", "--precision", "fp16",
                         "--rtol", "1e-2", "--atol", "1e-2", "--no-verify", "--output-format", "html", "--output", page)
    assert code == 0, err
    assert out == ""  # the page went to the file, not to stdout
    html = page.read_text()
    assert "<h2>Plan</h2>" in html and "overflow" in html and "data-chart='plan'" in html
