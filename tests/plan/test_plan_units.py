"""`preclint plan` units that are not modules (<inputs>, <outputs>, <param:NAME>), apply_policy's
cast model, the empty plan where the run without one meets, and the tolerance from [tool.preclint]."""

import copy
import json

import jsonschema
import pytest
import torch

from preclint.config import Config
from preclint.engine import CheckOptions, check_model
from preclint.load.loader import LoadedModel
from preclint.core.numerics import MODES
from preclint.measure.compare import Tolerance
from preclint.plan.document import KeepEntry
from preclint.plan.planner import Planner
from preclint.plan.units import Unit
from preclint.plan.command import build_plan
from preclint.policy import PolicyError, apply_policy, onnx_patterns, Kept
from tests.models.plan_culprits import Healthy, InlineFrozenNorm, OffsetInputs, TinyVariance, WideLayer
from tests.plan.test_plan import MODELS, SCHEMA, keeps, plan_for, run


def verified_plan(model, inputs, mode, tolerance):
    loaded = LoadedModel(model.eval(), tuple(inputs), "model", None)
    report, graph, _ = check_model(loaded, Config(precisions=(mode,)),
                                   CheckOptions(modes=(mode,), rtol=tolerance.rtol, atol=tolerance.atol))
    return build_plan(loaded, graph, report.findings, mode, tolerance, device="cpu"), graph, loaded


def test_a_parameter_the_format_cannot_hold_is_kept_alone_at_no_cost():
    """var holds 1e-9: float16 flushes it to 0 and rsqrt reads it; keeping that tensor alone is the
    plan, not the layers around it."""
    plan, _, _ = verified_plan(TinyVariance(), (torch.randn(8, 16),), "fp16-full", Tolerance(1e-2, 1e-2))
    assert keeps(plan) == {("<param:var>", None)}
    assert plan.keep[0].reason.startswith("underflow") and plan.kept_flops_fraction == 0
    assert plan.measured["before"].finite is False  # float16 without the plan: inf
    assert plan.measured["after"].finite and plan.meets_tolerance and plan.measured["runs"] == 1


@pytest.mark.slow
def test_a_frozen_norm_inside_a_block_keeps_its_buffer_not_the_block():
    """The block computes w * (running_var + eps).rsqrt() from its own buffers between two convs:
    the buffer reads are ops of the graph (not one constant the trace computed), so the plan names
    the buffer float16 flushes to 0 and keeps it alone, not the block around it."""
    torch.manual_seed(0)
    plan, graph, _ = verified_plan(InlineFrozenNorm(), (torch.randn(2, 3, 16, 16),), "fp16-full", Tolerance(1e-2, 1e-2))
    assert {n.params[0] for n in graph.nodes if n.fn == "parameter" and n.module_path == "block"} >= {"block.running_var"}
    assert ("block", None) not in keeps(plan)
    block = Planner(graph, MODES["fp16-full"], Tolerance(1e-2, 1e-2)).cost([Unit("block")])
    assert block > 0.5 and plan.kept_flops_fraction < 0.01 * block
    assert keeps(plan) == {("<param:block.running_var>", None)}
    assert plan.keep[0].reason.startswith("underflow")
    assert plan.measured["before"].finite is False  # float16 without the plan: inf
    assert plan.meets_tolerance and plan.measured["after"].failing_fraction == 0 and plan.measured["runs"] <= 3


@pytest.mark.slow
def test_a_batch_norm_module_whose_variance_flushes_is_kept_before_any_run():
    """torchvision's FrozenBatchNorm2d(eps=0) with a running variance of 1e-9: the module is one node,
    and its variance becomes 0 in a float16 model: predicted, so the first run with the plan is
    finite and no run is spent finding it."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(0)
    norm = FrozenBatchNorm2d(8, eps=0.0)
    with torch.no_grad():
        norm.running_var[:2] = 1e-9
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), norm, torch.nn.ReLU(),
                                torch.nn.Conv2d(8, 4, 3, padding=1))
    plan, _, _ = verified_plan(model, (torch.randn(2, 3, 8, 8) * 1e-4,), "fp16-full", Tolerance(1e-2, 1e-2))
    entry = next(k for k in plan.keep if k.module == "1")
    assert entry.reason.startswith("underflow")
    assert plan.measured["before"].finite is False
    assert plan.meets_tolerance and plan.measured["runs"] == 1
    assert not any(n.startswith("refined") for n in plan.notes)


def test_the_inputs_are_kept_when_their_rounding_is_the_culprit():
    """Inputs near 1000 carry their signal in hundredths: float16 holds them to 0.5 and no layer
    kept in float32 undoes that; <inputs> (fed in float32, not cast on entry) does."""
    x = 1000.0 + 0.01 * torch.randn(8, 16)
    plan, _, _ = verified_plan(OffsetInputs(), (x,), "fp16-full", Tolerance(1e-2, 1e-2))
    assert keeps(plan) == {("<inputs>", None)} and plan.kept_flops_fraction == 0
    assert plan.measured["before"].failing_fraction > 0.5
    assert plan.measured["after"].failing_fraction == 0 and plan.meets_tolerance


@pytest.mark.slow
def test_outputs_beyond_the_format_are_returned_in_float32():
    """A kept layer's float32 result above 65504 that the model returns: casting it back would make
    inf, so the plan keeps <outputs> as well."""
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.fc = torch.nn.Linear(16, 16)
            with torch.no_grad():
                self.fc.weight.mul_(3e5)

        def forward(self, x):
            return self.fc(x)

    plan, _ = plan_for(Wide(), (torch.randn(4, 16),), "fp16-full", atol=10.0)
    assert ("<outputs>", None) in keeps(plan) and plan.meets_tolerance
    outputs = next(k for k in plan.keep if k.module == "<outputs>")
    assert outputs.reason.startswith("overflow") and outputs.flops_fraction == 0


def test_apply_policy_full_mode_never_rounds_the_kept_modules_parameters():
    """A kept module's float32 weights are the original values, not float16 values cast back up."""
    original = WideLayer().eval()
    model = apply_policy(copy.deepcopy(original), {"precision": "fp16-full", "keep": ["big", "norm"]})
    assert torch.equal(model.big.weight, original.big.weight)  # bit for bit: never rounded
    assert model.big.weight.dtype == torch.float32 and model.fc1.weight.dtype == torch.float16
    seen = {}
    for name in ("fc1", "big", "norm", "head"):
        getattr(model, name).register_forward_hook(lambda m, a, out, name=name: seen.update({name: out.dtype}) and None)
    with torch.no_grad():
        y = model(torch.randn(8, 64))  # float32 inputs: cast to float16 on entry
    assert seen == {"fc1": torch.float16, "big": torch.float32, "norm": torch.float32, "head": torch.float16}
    assert y.dtype == torch.float16  # cast back at the output


def test_apply_policy_keeps_a_parameter_the_inputs_and_the_outputs():
    model = apply_policy(TinyVariance().eval(), {"precision": "fp16-full",
                                                 "keep": ["<param:var>", "<inputs>", "<outputs>"]})
    assert model.var.dtype == torch.float32 and model.fc.weight.dtype == torch.float16
    assert model.var[0].item() == pytest.approx(1e-9)
    seen = {}
    model.register_forward_pre_hook(lambda m, args: seen.update(entry=args[0].dtype) and None)
    with torch.no_grad():
        y = model(torch.randn(8, 16))
    assert torch.isfinite(y).all() and y.dtype == torch.float16  # <outputs>: as computed, by a float16 head
    assert seen["entry"] == torch.float32  # <inputs>: not cast on entry (fc casts them where it reads them)
    for keep, dtype in ((["head", "<outputs>"], torch.float32), (["head"], torch.float16)):
        with torch.no_grad():
            y = apply_policy(TinyVariance().eval(), {"precision": "fp16-full", "keep": keep})(torch.randn(8, 16))
        assert y.dtype == dtype, keep  # a kept head's float32 result, cast back unless <outputs> is kept


def test_a_policy_naming_a_parameter_the_model_lacks_is_an_error():
    with pytest.raises(PolicyError, match="<param:nope>"):
        apply_policy(TinyVariance(), {"precision": "fp16-full", "keep": ["<param:nope>"]})
    with pytest.raises(PolicyError, match="<everything>"):
        apply_policy(TinyVariance(), {"precision": "fp16-full", "keep": ["<everything>"]})


def test_units_that_are_not_modules_have_no_onnx_pattern():
    assert onnx_patterns([Kept("<inputs>"), Kept("<param:var>"), Kept("fc")]) == onnx_patterns([Kept("fc")])


@pytest.mark.slow
def test_the_run_without_a_plan_meeting_the_tolerance_empties_the_plan():
    """What the prediction kept as a surplus is not spent: the measurement without a plan meets."""
    model, x = Healthy().eval(), torch.randn(2, 3, 16, 16)
    loaded = LoadedModel(model, (x,), "model", None)
    report, graph, _ = check_model(loaded, Config(precisions=("fp16",)), CheckOptions(modes=("fp16",), rtol=1e-2, atol=1e-2))
    from preclint.plan import command as plan_command
    from preclint.plan.planner import make_plan

    plan = make_plan(graph, "fp16", Tolerance(1e-2, 1e-2), "model", report.findings)
    plan.keep = [KeepEntry("conv1", None, "accuracy", 0.5, 0.4)]  # as a pessimistic prediction would
    plan.kept_flops_fraction = 0.4
    basis = plan_command.PlanBasis(loaded, graph, report.findings, "fp16", Tolerance(1e-2, 1e-2))
    plan = plan_command.verify_plan(plan, basis, "cpu", fixed=False)
    assert plan.keep == [] and plan.kept_flops_fraction == 0 and plan.meets_tolerance
    assert plan.measured["runs"] == 0 and any("the run without a plan meets" in n for n in plan.notes)


def test_cli_json_plan_keeps_a_parameter_and_matches_the_schema(capsys):
    code, out, err = run(capsys, "plan", MODELS, "--model", "TinyVariance", "--input", "8x16", "--precision",
                         "fp16-full", "--rtol", "1e-2", "--atol", "1e-2", "--output-format", "json", "--device", "cpu")
    assert code == 0, err
    data = json.loads(out)
    jsonschema.validate(data, SCHEMA)
    assert [k["module"] for k in data["keep"]] == ["<param:var>"] and data["onnx_nodes_to_exclude"] == []


@pytest.mark.slow
def test_cli_decision_budget_from_the_configuration_file(capsys, tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.preclint]\nmax-flip = 0.01\n")
    code, out, err = run(capsys, "plan", MODELS, "--model", "OffsetClassifier", "--input", "256x32", "--precision",
                         "fp16", "--config", config, "--output-format", "json", "--no-verify")
    assert code == 0, err
    data = json.loads(out)
    assert data["tolerance"]["max_flip"] == 0.01 and [k["module"] for k in data["keep"]] == ["head"]


@pytest.mark.slow
def test_cli_value_tolerance_from_the_configuration_file(capsys, tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.preclint]\nrtol = 1e-2\natol = 1e-3\n")
    code, out, err = run(capsys, "plan", MODELS, "--model", "WideLayer", "--input", "8x64", "--precision", "fp16",
                         "--config", config, "--output-format", "json", "--no-verify")
    assert code == 0, err
    data = json.loads(out)
    assert data["tolerance"] == {"rtol": 0.01, "atol": 0.001} and [k["module"] for k in data["keep"]] == ["big"]


def test_cli_a_max_flip_outside_0_to_1_in_the_configuration_file_exits_2(capsys, tmp_path):
    config = tmp_path / "pyproject.toml"
    config.write_text("[tool.preclint]\nmax-flip = 2\n")
    code, out, err = run(capsys, "plan", MODELS, "--model", "OffsetClassifier", "--input", "256x32", "--precision",
                         "fp16", "--config", config, "--no-verify")
    assert code == 2 and "max-flip" in err and len(err.strip().splitlines()) == 1


class RoundedScores(torch.nn.Module):
    """Scores rounded to integers: a rounding decides, like an argmax, and float16 moves values
    across the half-integer boundaries."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x):
        return torch.round(self.fc(x) * 100.0).to(torch.int64)


def test_a_rounding_to_integers_is_a_decision_the_plan_predicts():
    """The plan read the rounding margins under a key nothing wrote, so a model whose output is a
    rounding had no decision to judge and no predicted flip fraction."""
    torch.manual_seed(0)
    plan, _, _ = verified_plan(RoundedScores(), (torch.randn(32, 64),), "fp16-full", Tolerance(max_flip=1e-3))
    flips = plan.predicted["before"].flip_fraction
    assert flips is not None and 1e-3 < flips < 0.2, flips
    # the verification compares integer outputs as decisions (it compared them as values, cast to
    # float64, and found none flipped): about 2% of the roundings move, as predicted
    measured = plan.measured["before"].flip_fraction
    assert measured is not None and 0.5 < measured / flips < 2, (measured, flips)
    # float16 inputs move a third of those flips: the layer alone is not enough, the inputs with it are
    assert keeps(plan) == {("<inputs>", None), ("fc", None)}
    assert plan.meets_tolerance and plan.measured["after"].flip_fraction == 0 and plan.measured["runs"] == 1


@pytest.mark.slow
def test_a_plan_that_meets_with_error_to_spare_is_made_cheaper_and_verified():
    """PCL103's bad example: the error model over-predicts what two convolutions beside the collapsed
    frozen batch norm add, so the first plan keeps more than the tolerance needs. The measurement
    calibrates the model, a cheaper plan is run, and it is kept only because it meets too."""
    from preclint.rules import all_rules

    model, inputs = all_rules()["PCL103"].bad[0].build()
    with torch.no_grad():
        rms = float(model.double()(*[i.double() for i in inputs]).pow(2).mean().sqrt())
    model.float()
    tolerance = Tolerance(1e-2, 1e-2 * rms)
    loaded = LoadedModel(model.eval(), tuple(inputs), "model", None)
    report, graph, _ = check_model(loaded, Config(precisions=("fp16-full",)),
                                   CheckOptions(modes=("fp16-full",), rtol=tolerance.rtol, atol=tolerance.atol))
    predicted_only = build_plan(loaded, graph, report.findings, "fp16-full", tolerance, verify=False)
    plan = build_plan(loaded, graph, report.findings, "fp16-full", tolerance, device="cpu")
    assert plan.meets_tolerance and plan.measured["after"].rel_error < tolerance.rtol
    assert plan.kept_flops_fraction < predicted_only.kept_flops_fraction
    assert any(note.startswith("made cheaper after run 1") for note in plan.notes)
    assert 2 <= plan.measured["runs"] <= 3
    assert ("layer1.0.bn1", None) in keeps(plan)  # the collapsed norm stays whatever the calibration says
