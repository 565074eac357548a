"""`preclint plan --formats fp8,mxfp8,bf16`: a format per layer, from the predictions, verified by running
the mixed assignment."""
import pytest
import torch

from preclint.plan import formats, scaled
from preclint.plan.formats import FormatsPlan, parse_formats
from tests.helpers import check

OUTLIER = 2e5  # one activation channel this large: a tensorwise FP8 scale crushes the others, MXFP8 one block


class _MassiveChannel(torch.nn.Module):
    """A first layer reading a massive channel (through a small weight column, as in LLMs), then two plain ones."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(3))
        with torch.no_grad():
            self.layers[0].weight[:, 3] /= OUTLIER

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _massive_channel():
    torch.manual_seed(0)
    x = torch.randn(2, 16, 256)
    x[..., 3] = OUTLIER
    return _MassiveChannel().eval(), x


def test_the_formats_are_taken_cheapest_first():
    assert parse_formats("bf16, fp8,nvfp4,mxfp8") == ["nvfp4", "fp8", "mxfp8", "bf16"]
    assert parse_formats("fp8-rowwise,fp8") == ["fp8", "fp8-rowwise"]


def test_the_exports_give_each_tool_its_layers_per_format():
    plan = FormatsPlan(["nvfp4", "fp8", "fp8-rowwise", "bf16"], 0.1,
                       assignment={"a": "nvfp4", "b": "fp8", "c": "fp8-rowwise", "head": "bf16"},
                       layer_flops={"a": 1.0, "b": 1.0, "c": 1.0, "head": 1.0})
    exports = plan.exports()
    cfg = exports["modelopt"]["quant_cfg"]
    assert cfg["*.a.weight_quantizer"]["num_bits"] == (2, 1) and cfg["a.input_quantizer"]["block_sizes"][-1] == 16
    assert cfg["*.b.weight_quantizer"] == {"num_bits": (4, 3), "axis": None} and cfg["*.head.*"] == {"enable": False}
    from fnmatch import fnmatchcase

    # the patterns take the layer at the root or under a wrapper, never another whose name ends the same
    assert [p for p in cfg if fnmatchcase("model.sub_b.weight_quantizer", p)] == []
    assert [p for p in cfg if fnmatchcase("model.b.weight_quantizer", p)] == ["*.b.weight_quantizer"]
    assert eval(exports["modelopt"]["python"][len("quant_cfg.update("):-1]) == cfg  # the snippet is Python
    calls = []
    namespace = {"Float8LinearConfig": type("C", (), {"from_recipe_name": staticmethod(lambda name: name)}),
                 "convert_to_float8_training": lambda model, config, module_filter_fn: calls.append(
                     (config, [fqn for fqn in ("a", "b", "c", "head") if module_filter_fn(None, fqn)])),
                 "model": None}
    exec(exports["torchao"]["float8"], namespace)  # one conversion per torchao recipe, each with its layers
    assert calls == [("tensorwise", ["b"]), ("rowwise", ["c"])]
    assert exports["torchao"]["fqns"] == {"nvfp4": ["a"], "fp8": ["b"], "fp8-rowwise": ["c"], "bf16": ["head"]}
    te = exports["transformer_engine"]
    assert te["layers"]["nvfp4"] == ["a"] and te["recipes"]["nvfp4"] == "NVFP4BlockScaling"
    assert te["outside_fp8_autocast"] == ["head"] and exports["preclint"]["formats"] == plan.assignment


@pytest.mark.slow
def test_a_wider_format_takes_the_layer_that_fp8_alone_keeps_in_bf16():
    model, x = _massive_channel()
    _, graph, _ = check(model, (x,), precisions=("fp8", "mxfp8"))
    rtol = 0.15
    fp8_only = scaled.choose(graph, "fp8", rtol)
    assert fp8_only.keep == ["layers.0"]  # the massive channel crushes its FP8 tensorwise scale
    plan = formats.choose(graph, parse_formats("fp8,mxfp8,bf16"), rtol)
    assert plan.assignment == {"layers.0": "mxfp8", "layers.1": "fp8", "layers.2": "fp8"}
    assert len(plan.layers_in("bf16")) < len(fp8_only.keep)
    assert plan.predicted <= rtol < plan.predicted_cheapest
    formats.verify(plan, model, (x,), graph, "cpu")
    assert plan.measured <= rtol and plan.meets_tolerance and "emulated" in plan.how
    assert abs(plan.measured / plan.predicted - 1) < 0.2
    assert plan.to_json()["exports"]["preclint"]["formats"] == plan.assignment


def _model_file(tmp_path):
    model = tmp_path / "m.py"
    model.write_text("import torch\ntorch.manual_seed(0)\nmodel = torch.nn.Sequential(torch.nn.Linear(32, 32))\n"
                     "example_inputs = (torch.randn(4, 32),)\n")
    return str(model)


@pytest.mark.parametrize("arguments, message", [
    (["--formats", "fp8,int4", "--rtol", "0.1"], "unknown format 'int4' in --formats"),
    (["--formats", "fp8,bf16", "--precision", "fp8", "--rtol", "0.1"], "give it without --precision"),
    (["--formats", "bf16", "--rtol", "0.1"], "needs at least one scaled format"),
    (["--formats", "fp8,bf16"], "a plan with --formats needs --rtol"),
])
def test_a_wrong_formats_list_is_one_line_and_exit_2(arguments, message, capsys, tmp_path):
    from preclint.cli import main

    assert main(["plan", _model_file(tmp_path), *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_a_list_without_a_format_wide_enough_is_one_line_and_exit_2(capsys, tmp_path):
    from preclint.cli import main

    assert main(["plan", _model_file(tmp_path), "--formats", "nvfp4,fp8", "--rtol", "0.001"]) == 2
    err = capsys.readouterr().err
    assert "no format in --formats nvfp4, fp8 is wide enough" in err and "add bf16" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_the_cli_prints_and_writes_the_mixed_plan(capsys, tmp_path):
    import json

    from preclint.cli import main

    path = _model_file(tmp_path)
    assert main(["plan", path, "--formats", "fp8,bf16", "--rtol", "0.5", "--output-format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["assignment"] == {"0": "fp8"}
    assert document["measured"] <= 0.5 and document["meets_tolerance"]
    assert main(["plan", path, "--formats", "fp8,bf16", "--rtol", "0.5", "--no-verify"]) == 0
    assert "plan: formats fp8,bf16" in capsys.readouterr().out
