"""`preclint plan --precision fp8`: the layers kept in bfloat16, from the predictions, verified by running them."""
import pytest
import torch

from preclint.plan.scaled import ScaledPlan, choose, verify
from tests.helpers import check


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 256),
                                                              torch.nn.ReLU(), torch.nn.Linear(256, 64)) for _ in range(2))
        self.head = torch.nn.Linear(64, 32)

    def forward(self, x):
        for block in self.blocks:
            x = x + block(x)
        return self.head(x)


def test_the_exports_name_the_kept_layers_as_each_tool_takes_them():
    plan = ScaledPlan("fp8", 0.02, keep=["head", "blocks.0.3"])
    exports = plan.exports()
    assert exports["torchao"]["fqns_kept"] == ["head", "blocks.0.3"]
    namespace = {"Float8LinearConfig": type("C", (), {"from_recipe_name": staticmethod(lambda name: name)}),
                 "convert_to_float8_training": lambda model, config, module_filter_fn: (config, module_filter_fn),
                 "model": None}
    exec(exports["torchao"]["module_filter_fn"], namespace)  # the snippet runs as written
    fn = namespace["module_filter_fn"]
    assert not fn(None, "head") and fn(None, "blocks.1.3")
    assert exports["modelopt"]["quant_cfg"] == {"*head.*": {"enable": False}, "*blocks.0.3.*": {"enable": False}}
    assert exports["transformer_engine"]["outside_fp8_autocast"] == ["head", "blocks.0.3"]
    assert ScaledPlan("nvfp4", 0.1).exports()["torchao"] is None  # torchao's float8 training has no NVFP4 recipe


@pytest.mark.slow
def test_the_plan_meets_the_tolerance_predicted_and_measured():
    torch.manual_seed(0)
    model, x = _Net().eval(), torch.randn(2, 16, 64)
    _, graph, ctx = check(model, (x,), precisions=("fp8",))
    everything = ctx.predictions["fp8"].rel_error
    plan = choose(graph, "fp8", everything / 2)
    assert 0 < len(plan.keep) < plan.layers == 5 and plan.predicted <= everything / 2
    assert plan.kept_flops < 1.0
    verify(plan, model, (x,), graph, "cpu")
    assert plan.measured <= plan.rtol and plan.measured_all > plan.rtol and "emulated" in plan.how
    assert plan.meets_tolerance and plan.to_json()["exports"]["preclint"] == {"scaling": {"keep": plan.keep}}


def test_a_scaled_plan_without_rtol_is_one_line_and_exit_2(capsys, tmp_path):
    from preclint.cli import main

    model = tmp_path / "m.py"
    model.write_text("import torch\nmodel = torch.nn.Linear(16, 16)\nexample_inputs = (torch.randn(2, 16),)\n")
    assert main(["plan", str(model), "--precision", "fp8"]) == 2
    err = capsys.readouterr().err
    assert "a plan for fp8 needs --rtol" in err and len(err.strip().splitlines()) == 1
