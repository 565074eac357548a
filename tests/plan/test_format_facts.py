"""A numeric format's facts live on its Mode (bits per element, how torchao, ModelOpt and Transformer
Engine name it, the layers it cannot run): the plan's exports and PCL109 read them, so a new format
is one entry of the mode table."""
from dataclasses import replace

from preclint.core.ir import Kind
from preclint.core.numerics import MODES, SCALED_MODES, Exports
from preclint.plan import formats
from preclint.plan.formats import FormatsPlan, parse_formats
from preclint.plan.scaled import ScaledPlan
from preclint.rules.model.format_unsupported_layer import FormatUnsupportedLayer


def test_the_tools_name_each_scaled_format_as_they_document_it():
    named = {name: (MODES[name].exports.torchao, MODES[name].exports.modelopt, MODES[name].exports.transformer_engine)
             for name in SCALED_MODES}
    assert named == {"fp8": ("tensorwise", "FP8_DEFAULT_CFG", "Float8CurrentScaling"),
                     "fp8-rowwise": ("rowwise", "FP8_PER_CHANNEL_PER_TOKEN_CFG", None),
                     "mxfp8": (None, "MXFP8_DEFAULT_CFG", "MXFP8BlockScaling"),
                     "nvfp4": (None, "NVFP4_DEFAULT_CFG", "NVFP4BlockScaling")}
    assert all(set(MODES[name].exports.modelopt_quantizers) == {"weight", "input"} for name in SCALED_MODES)


def test_the_block_formats_run_no_convolution_and_pcl109_concerns_them_cheapest_first():
    assert {name for name, mode in MODES.items() if Kind.CONV in mode.unsupported} == {"nvfp4", "mxfp8"}
    assert FormatUnsupportedLayer.precisions == ("nvfp4", "mxfp8")


def test_modes_stay_hashable_with_their_exports():
    assert len({MODES[name] for name in MODES}) == len(MODES)


def test_a_new_format_is_one_mode_entry(monkeypatch):
    # a format between nvfp4 (4.5 bits) and fp8 (8): the plan orders, exports and names it from its entry alone
    mode = replace(MODES["nvfp4"], name="mxfp6", bits_per_element=6.25,
                   exports=Exports("mxfp6-recipe", "MXFP6_CFG", {"weight": {"num_bits": (3, 2)},
                                                                  "input": {"num_bits": (3, 2)}}, "MXFP6Scaling"))
    monkeypatch.setitem(MODES, "mxfp6", mode)
    monkeypatch.setattr(formats, "SCALED_MODES", (*SCALED_MODES, "mxfp6"))
    assert parse_formats("bf16,fp8,mxfp6,nvfp4") == ["nvfp4", "mxfp6", "fp8", "bf16"]
    plan = FormatsPlan(["mxfp6", "bf16"], 0.1, assignment={"a": "mxfp6", "head": "bf16"},
                       layer_flops={"a": 1.0, "head": 1.0})
    exports = plan.exports()
    assert exports["modelopt"]["config"] == "MXFP6_CFG"
    assert exports["modelopt"]["quant_cfg"]["a.weight_quantizer"] == {"num_bits": (3, 2)}
    assert exports["transformer_engine"]["recipes"] == {"mxfp6": "MXFP6Scaling"}
    assert 'from_recipe_name("mxfp6-recipe")' in exports["torchao"]["float8"]
    kept = ScaledPlan("mxfp6", 0.1, keep=["a"]).exports()
    assert kept["modelopt"]["config"] == "MXFP6_CFG" and 'from_recipe_name("mxfp6-recipe")' in kept["torchao"]["module_filter_fn"]
