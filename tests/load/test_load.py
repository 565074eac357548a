"""preclint.load.loader: from a target on the command line to (module, example inputs)."""

import argparse
import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from preclint.core.notes import texts
from preclint.core.errors import UserError
from preclint.load.input_specs import parse_input, parse_shape
from preclint.load.loader import LoadedModel, load_model
from tests.paths import MODELS

MODELS = MODELS


def fixture(name: str) -> str:
    return str(MODELS / name)


def write(directory: Path, name: str, source: str) -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(source))
    return path


def user_error(*args, **kwargs) -> str:
    """The UserError message load_model raises for these arguments."""
    with pytest.raises(UserError) as info:
        load_model(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message, "a UserError is one line"
    return message


# ---------------------------------------------------------------------------------------------
# Finding the model


def test_root_class_is_found_among_its_blocks():
    loaded = load_model(fixture("blocks_and_net.py"))
    assert isinstance(loaded, LoadedModel)
    assert type(loaded.module).__name__ == "Net"
    assert loaded.name.endswith("blocks_and_net.py:Net")
    assert loaded.source_path == str(MODELS / "blocks_and_net.py")
    assert not loaded.module.training and not loaded.module.dropout.training
    # example_inputs from the file
    assert len(loaded.args) == 1 and loaded.args[0].shape == (2, 8)
    assert loaded.module(*loaded.args).shape == (2, 2)


def test_sibling_import_works_and_sys_path_is_restored():
    before = list(sys.path)
    load_model(fixture("blocks_and_net.py"))
    assert sys.path == before


def test_model_flag_picks_a_zero_argument_class():
    loaded = load_model(fixture("blocks_and_net.py"), model="Block")
    assert type(loaded.module).__name__ == "Block"
    assert loaded.name.endswith("blocks_and_net.py:Block")


def test_file_colon_attr_target_is_the_same_as_model_flag():
    loaded = load_model(fixture("blocks_and_net.py") + ":Block")
    assert type(loaded.module).__name__ == "Block"
    assert load_model(fixture("blocks_and_net.py") + ":Block", model="Block").name == loaded.name


def test_module_level_model_instance_and_callable_example_inputs():
    loaded = load_model(fixture("instance_and_factory.py"))
    assert loaded.name.endswith("instance_and_factory.py:model")
    assert loaded.module.fc.out_features == 5
    assert loaded.args[0].shape == (1, 4)


def test_model_flag_accepts_a_factory_and_an_instance():
    factory = load_model(fixture("instance_and_factory.py"), model="make_small")
    assert factory.module.fc.out_features == 3
    instance = load_model(fixture("instance_and_factory.py"), model="other")
    assert instance.module.fc.out_features == 7
    assert not instance.module.training


def test_example_input_array_on_the_model():
    loaded = load_model(fixture("lightning_style.py"))
    assert [tuple(x.shape) for x in loaded.args] == [(2, 6), (2, 6)]
    loaded.module(*loaded.args)


def test_list_of_images_input_keeps_its_structure():
    loaded = load_model(fixture("detector_like.py"))
    assert len(loaded.args) == 1
    (images,) = loaded.args
    assert isinstance(images, list)
    assert [tuple(image.shape) for image in images] == [(3, 32, 32), (3, 24, 40)]
    assert len(loaded.module(*loaded.args)) == 2


def test_package_module_target_with_and_without_attr(tmp_path, monkeypatch):
    # The working directory is importable, as for `preclint check mypkg.nets` run from a repo root.
    monkeypatch.chdir(tmp_path)
    package = tmp_path / "preclint_test_pkg_load"
    package.mkdir()
    write(package, "__init__.py", "")
    write(package, "nets.py", """
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(3, 3)
    """)
    path_before = list(sys.path)
    searched = load_model("preclint_test_pkg_load.nets", input_shapes=[(1, 3)])
    assert searched.name == "preclint_test_pkg_load.nets:Net"
    assert searched.source_path == str(package / "nets.py")
    named = load_model("preclint_test_pkg_load.nets:Net", input_shapes=[(1, 3)])
    assert type(named.module) is type(searched.module)
    assert sys.path == path_before


@pytest.mark.slow
def test_torchvision_factory_with_input_shape():
    loaded = load_model("torchvision.models:resnet18", input_shapes=[(1, 3, 64, 64)])
    assert loaded.name == "torchvision.models:resnet18"
    assert loaded.source_path.endswith(os.path.join("torchvision", "models", "resnet.py"))
    assert not loaded.module.training
    assert loaded.args[0].shape == (1, 3, 64, 64) and loaded.args[0].dtype == torch.float32
    with torch.no_grad():
        assert loaded.module(*loaded.args).shape == (1, 1000)


# ---------------------------------------------------------------------------------------------
# Inputs and determinism


def test_input_shapes_override_example_inputs_and_follow_dtype():
    floats = load_model(fixture("lightning_style.py"), input_shapes=[(4, 6), (6,)], input_dtype="float16")
    assert [(tuple(x.shape), x.dtype) for x in floats.args] == [((4, 6), torch.float16), ((6,), torch.float16)]
    assert all(0 <= x.min() and x.max() < 1 for x in floats.args)  # rand in [0, 1)
    ints = load_model(fixture("blocks_and_net.py"), input_shapes=[(100,)], input_dtype="int64")
    (tokens,) = ints.args
    # no embedding reads them: {0, 1}, a valid mask and a valid index into anything
    assert tokens.dtype == torch.int64 and set(tokens.tolist()) == {0, 1}
    assert load_model(fixture("blocks_and_net.py"), input_shapes=["3,8"]).args[0].shape == (3, 8)


def test_seed_makes_weights_and_inputs_deterministic():
    first = load_model(fixture("blocks_and_net.py"), input_shapes=[(2, 8)], seed=3)
    again = load_model(fixture("blocks_and_net.py"), input_shapes=[(2, 8)], seed=3)
    other = load_model(fixture("blocks_and_net.py"), input_shapes=[(2, 8)], seed=4)
    assert torch.equal(first.args[0], again.args[0])
    assert torch.equal(first.module.head.weight, again.module.head.weight)
    assert not torch.equal(first.module.head.weight, other.module.head.weight)
    # Module-level example_inputs are made under the seed too.
    assert torch.equal(load_model(fixture("blocks_and_net.py")).args[0],
                       load_model(fixture("blocks_and_net.py")).args[0])


def test_found_root_has_the_same_weights_as_the_named_one():
    found = load_model(fixture("blocks_and_net.py"))
    named = load_model(fixture("blocks_and_net.py"), model="Net")
    assert torch.equal(found.module.head.weight, named.module.head.weight)


@pytest.mark.parametrize("text, shape", [
    ("1,3,224,224", (1, 3, 224, 224)),
    (" 1, 3 ,8 ", (1, 3, 8)),
    ("(3,)", (3,)),
    ("[2,5]", (2, 5)),
    ("7", (7,)),
    ("1x3x224x224", (1, 3, 224, 224)),
])
def test_parse_shape(text, shape):
    assert parse_shape(text) == shape


@pytest.mark.parametrize("text", ["", "1,,3", "1,a", "1xx3", "-1,3", "1.5", ",", "x"])
def test_parse_shape_rejects_bad_text(text):
    with pytest.raises(UserError, match="bad input shape"):
        parse_shape(text)


def test_parse_shape_rejects_zero():
    with pytest.raises(UserError, match="must be positive integers"):
        parse_shape("0,3")


# ---------------------------------------------------------------------------------------------
# Weights




@pytest.mark.parametrize("wrap", [
    lambda sd: sd,
    lambda sd: {"state_dict": sd, "epoch": 3},
    lambda sd: {"model": sd, "optimizer": {}},
    lambda sd: {f"module.{key}": value for key, value in sd.items()},  # saved from DDP
])
def test_weights_round_trip(tmp_path, trained_state_dict, wrap):
    path = tmp_path / "weights.pt"
    torch.save(wrap(trained_state_dict), path)
    loaded = load_model(fixture("blocks_and_net.py"), weights=str(path))
    for key, value in loaded.module.state_dict().items():
        assert torch.equal(value, trained_state_dict[key]), key
    assert not loaded.module.training


def test_weights_mismatch_names_the_keys(tmp_path, trained_state_dict):
    state_dict = dict(trained_state_dict)
    del state_dict["head.bias"]
    state_dict["head.extra"] = torch.zeros(1)
    state_dict["head.weight"] = torch.zeros(3, 8)
    path = tmp_path / "weights.pt"
    torch.save(state_dict, path)
    message = user_error(fixture("blocks_and_net.py"), weights=str(path))
    assert "weights.pt: weights do not match the model" in message
    assert "missing head.bias" in message
    assert "unexpected head.extra" in message
    assert "shape mismatch head.weight (3, 8) vs (2, 8) in the model" in message


def test_weights_mismatch_lists_only_the_first_few(tmp_path):
    path = tmp_path / "empty.pt"
    torch.save({}, path)
    message = user_error(fixture("blocks_and_net.py"), weights=str(path))
    assert "missing blocks.0.linear.weight, blocks.0.linear.bias, blocks.1.linear.weight and 3 more" in message


def test_weights_that_are_not_weights_only_loadable(tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save(argparse.Namespace(lr=0.1), path)
    message = user_error(fixture("blocks_and_net.py"), weights=str(path))
    assert "pickled.pt: cannot be loaded with weights_only=True" in message
    assert "Unsupported global: GLOBAL argparse.Namespace was not an allowed global by default." in message
    assert "torch.save(model.state_dict(), path)" in message


def test_weights_file_that_is_not_a_checkpoint(tmp_path):
    path = write(tmp_path, "notes.pt", "hello")
    assert "notes.pt: cannot be loaded with weights_only=True" in user_error(
        fixture("blocks_and_net.py"), weights=str(path))


def test_weights_that_are_not_a_state_dict(tmp_path):
    path = tmp_path / "list.pt"
    torch.save([torch.zeros(1)], path)
    assert "list.pt: holds a list, not a state dict" in user_error(
        fixture("blocks_and_net.py"), weights=str(path))


def test_missing_weights_file_fails_before_running_user_code(tmp_path):
    marker = tmp_path / "ran"
    model_file = write(tmp_path, "model.py", f"open({str(marker)!r}, 'w')\n")
    assert user_error(str(model_file), weights=str(tmp_path / "nope.pt")) == (
        f"no such weights file: {tmp_path / 'nope.pt'}")
    assert not marker.exists()


# ---------------------------------------------------------------------------------------------
# Mistakes a user can make: each one line


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run from tmp_path, so messages show the short relative path model.py."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_missing_file(in_tmp):
    assert user_error("x.py") == "no such file: x.py"
    assert user_error("models/x.py:Net") == "no such file: models/x.py"


def test_directory_given(in_tmp):
    (in_tmp / "models").mkdir()
    assert user_error("models") == (
        "models: is a directory; expected a Python file (model.py) or package.module[:attr]")


def test_directory_given_as_weights(in_tmp):
    (in_tmp / "ckpt").mkdir()
    assert user_error(fixture("blocks_and_net.py"), weights="ckpt") == (
        "ckpt: is a directory, expected a weights file")


def test_not_a_python_file(in_tmp):
    torch.save({}, in_tmp / "model.pt")
    assert user_error("model.pt").startswith("model.pt: not a Python file")


def test_syntax_error(in_tmp):
    write(in_tmp, "model.py", """
        import torch

        def broken(:
            pass
    """)
    message = user_error("model.py")
    assert message.startswith("model.py:4: syntax error: ")
    assert "invalid syntax" in message


def test_import_error_inside_the_file(in_tmp):
    write(in_tmp, "model.py", """
        import torch
        import preclint_no_such_package_xyz
    """)
    assert user_error("model.py") == (
        "model.py:3: importing the file failed: "
        "ModuleNotFoundError: No module named 'preclint_no_such_package_xyz'"
    )


def test_script_that_exits_while_imported(in_tmp, capsys):
    write(in_tmp, "model.py", """
        import sys
        sys.exit("run me as a script")
    """)
    assert user_error("model.py") == "model.py:3: importing the file failed: SystemExit: run me as a script"


def test_exception_while_building_the_model(in_tmp):
    write(in_tmp, "model.py", """
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                raise RuntimeError("cannot build\\nthis net")
    """)
    assert user_error("model.py", input_shapes=[(1,)]) == (
        "model.py:7: building Net() failed: RuntimeError: cannot build this net"
    )


def test_only_candidate_needs_arguments(in_tmp):
    write(in_tmp, "model.py", """
        from torch import nn

        class Net(nn.Module):
            def __init__(self, num_classes, width=3):
                super().__init__()
    """)
    assert user_error("model.py") == (
        "model.py: Net() needs arguments (missing: 'num_classes'); define `model = Net(...)` "
        "in the file or pass --model with a zero-argument factory"
    )


def test_named_class_needs_arguments():
    message = user_error(fixture("instance_and_factory.py"), model="Classifier")
    assert message.endswith(
        "instance_and_factory.py: Classifier() needs arguments (missing: 'num_classes'); "
        "define `model = Classifier(...)` in the file or pass --model with a zero-argument factory"
    )


def test_named_attr_that_is_not_a_model():
    assert user_error(fixture("instance_and_factory.py"), model="not_a_model").endswith(
        "instance_and_factory.py: 'not_a_model' is a int, not an nn.Module, "
        "an nn.Module subclass or a zero-argument factory")
    assert user_error(fixture("instance_and_factory.py"), model="make_nothing").endswith(
        "instance_and_factory.py: make_nothing() returned str, not an nn.Module")


def test_named_attr_missing_suggests_a_close_name():
    assert user_error(fixture("blocks_and_net.py"), model="Nett").endswith(
        "blocks_and_net.py has no attribute 'Nett' (did you mean 'Net'?)")


def test_model_named_twice_differently():
    assert "give only one" in user_error(fixture("blocks_and_net.py") + ":Net", model="Block")


def test_several_roots():
    assert user_error(fixture("two_roots.py")).endswith(
        "two_roots.py: several candidate models (Encoder, Decoder); pass --model NAME to choose one")


def test_no_module_found():
    assert user_error(fixture("no_module.py")).endswith(
        "no_module.py: no nn.Module found (looked for --model NAME, a module-level nn.Module "
        "instance named 'model', and nn.Module subclasses defined in it)")


def test_no_example_inputs():
    message = user_error(fixture("two_roots.py"), model="Encoder")
    assert "no example inputs" in message
    for way in ("--input ", "input_ids=1x128:int64", "example_inputs", "example_input_array"):
        assert way in message


def test_example_inputs_of_the_wrong_kind(in_tmp):
    write(in_tmp, "model.py", """
        import torch
        from torch import nn

        class Net(nn.Module):
            pass

        example_inputs = (torch.rand(2), {"mask": {1, 2}})
    """)
    assert user_error("model.py") == (
        "model.py: example_inputs[1]['mask'] is a set; an input is a Tensor, None, a number or a string, "
        "or a list, tuple, dict or object holding them (a transformers Cache)")


def test_unknown_dtype():
    assert user_error(fixture("blocks_and_net.py"), input_shapes=[(1, 8)], input_dtype="flaot16") == (
        "unknown input dtype 'flaot16': expected a torch dtype name such as float32, float16, bfloat16 or int64")


def test_module_not_importable():
    assert user_error("preclint_no_such_package_xyz.models:Net") == (
        "cannot import module 'preclint_no_such_package_xyz.models': "
        "No module named 'preclint_no_such_package_xyz'")


def test_module_attr_missing():
    assert user_error("torchvision.models:resnet5000", input_shapes=[(1, 3, 8, 8)]).startswith(
        "torchvision.models has no attribute 'resnet5000' (did you mean ")


def test_weight_downloads_are_refused(in_tmp):
    # As torchvision's detection factories do by default for their backbone.
    write(in_tmp, "model.py", f"""
        import torch
        from torch import nn

        def pretrained():
            net = nn.Linear(2, 2)
            url = "https://example.invalid/linear.pth"
            net.load_state_dict(torch.hub.load_state_dict_from_url(url, model_dir={str(in_tmp)!r}))
            return net
    """)
    original = torch.hub.download_url_to_file
    message = user_error("model.py", model="pretrained", input_shapes=[(1, 2)])
    assert message.startswith(
        "model.py:8: building pretrained() failed: it tried to download https://example.invalid/linear.pth; "
        "preclint never downloads weights")
    assert torch.hub.download_url_to_file is original


def test_module_whose_own_import_fails(in_tmp):
    package = in_tmp / "preclint_test_pkg_broken"
    package.mkdir()
    write(package, "__init__.py", "import preclint_no_such_package_xyz\n")
    assert user_error("preclint_test_pkg_broken:Net") == (
        "importing module 'preclint_test_pkg_broken' failed: "
        "ModuleNotFoundError: No module named 'preclint_no_such_package_xyz'")


# ---------------------------------------------------------------------------------------------
# Inputs as users write them: positional with None, keywords, (args, kwargs), nested structures

ENCODER_DECODER = """
    import torch
    from torch import nn

    class Seq2Seq(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(50, 8)

        def forward(self, input_ids, attention_mask=None, decoder_input_ids=None, **kwargs):
            h = self.embed(input_ids)
            if attention_mask is not None:
                h = h * attention_mask.unsqueeze(-1)
            return h.mean(1) + self.embed(decoder_input_ids).mean(1)
"""


def load_with(in_tmp, example_inputs: str, body: str = ENCODER_DECODER) -> LoadedModel:
    write(in_tmp, "model.py", textwrap.dedent(body) + "\n" + textwrap.dedent(example_inputs))
    return load_model("model.py")


def ids(*shape):
    return f"torch.randint(0, 50, {shape})"


def test_positional_inputs_may_be_none(in_tmp):
    # T5's call as users write it: model(input_ids, None, decoder_input_ids)
    loaded = load_with(in_tmp, f"def example_inputs():\n    return ({ids(1, 6)}, None, {ids(1, 4)})")
    assert loaded.args[1] is None and loaded.kwargs == {}
    assert [tuple(a.shape) for a in loaded.args if a is not None] == [(1, 6), (1, 4)]
    loaded.inputs.call(loaded.module)


def test_a_dict_is_the_keyword_inputs(in_tmp):
    loaded = load_with(in_tmp, f"example_inputs = dict(input_ids={ids(1, 6)}, decoder_input_ids={ids(1, 4)}, "
                               "attention_mask=torch.ones(1, 6), use_cache=False)")
    assert loaded.args == ()
    assert list(loaded.kwargs) == ["input_ids", "decoder_input_ids", "attention_mask", "use_cache"]
    assert loaded.inputs.describe() == ("input_ids=1x6 int64, decoder_input_ids=1x4 int64, "
                                        "attention_mask=1x6 float32, use_cache=False")
    loaded.inputs.call(loaded.module)


def test_a_pair_of_a_sequence_and_a_dict_is_args_and_kwargs(in_tmp):
    loaded = load_with(in_tmp, f"example_inputs = (({ids(1, 6)},), {{'decoder_input_ids': {ids(1, 4)}}})")
    assert len(loaded.args) == 1 and list(loaded.kwargs) == ["decoder_input_ids"]
    loaded.inputs.call(loaded.module)


def test_a_sequence_and_a_dict_as_two_positional_inputs_are_wrapped_once_more(in_tmp):
    body = """
        import torch
        from torch import nn

        class Detector(nn.Module):  # a training-style call: a list of images and a dict of targets
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 2, 3)

            def forward(self, images, targets):
                return [self.conv(i.unsqueeze(0)).mean() * targets["scale"] for i in images]
    """
    loaded = load_with(in_tmp, "example_inputs = (([torch.rand(3, 8, 8)], {'scale': torch.ones(())}), {})", body)
    images, targets = loaded.args
    assert isinstance(images, list) and isinstance(targets, dict) and loaded.kwargs == {}
    assert loaded.inputs.describe() == "[3x8x8 float32], {scale: scalar float32}"
    loaded.inputs.call(loaded.module)


def test_example_input_array_follows_lightning(in_tmp):
    body = ENCODER_DECODER.replace("self.embed = nn.Embedding(50, 8)",
                                   f"self.embed = nn.Embedding(50, 8)\n            "
                                   f"self.example_input_array = {{'input_ids': {ids(1, 6)}, "
                                   f"'decoder_input_ids': {ids(1, 3)}}}")
    loaded = load_with(in_tmp, "", body)
    assert loaded.args == () and list(loaded.kwargs) == ["input_ids", "decoder_input_ids"]


@pytest.mark.parametrize("example_inputs, message", [
    ("example_inputs = {1: torch.zeros(1)}",
     "model.py: example_inputs has the key 1; keyword inputs are named by strings"),
    ("example_inputs = ((torch.zeros(1, 2, dtype=torch.long),), {'mask': object()})",
     "model.py: example_inputs[1]['mask'] is an object; an input is a Tensor, None, a number or a string, "
     "or a list, tuple, dict or object holding them (a transformers Cache)"),
    ("example_inputs = 3",
     "model.py: example_inputs is an int; expected a Tensor, a tuple of positional inputs, a dict of keyword "
     "inputs or (args, kwargs)"),
    ("example_inputs = {'input_ids': torch.zeros(1, 2, dtype=torch.long), 'attention_maks': None}",
     "model.py: Net.forward() has no parameter 'attention_maks' (did you mean 'attention_mask'?) "
     "(its parameters: input_ids, attention_mask)"),
    ("example_inputs = (torch.zeros(1, 2, dtype=torch.long),) * 3",
     "model.py: Net.forward() does not take the example inputs (1x2 int64, 1x2 int64, 1x2 int64): "
     "too many positional arguments"),
])
def test_example_inputs_mistakes_are_one_line(in_tmp, example_inputs, message):
    write(in_tmp, "model.py", """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(10, 4)

            def forward(self, input_ids, attention_mask=None):
                return self.embed(input_ids)
    """)
    (in_tmp / "model.py").write_text((in_tmp / "model.py").read_text() + example_inputs + "\n")
    assert user_error("model.py") == message


def test_a_misspelt_keyword_that_kwargs_swallows_is_noted(in_tmp):
    loaded = load_with(in_tmp, f"example_inputs = dict(input_ids={ids(1, 6)}, decoder_input_ids={ids(1, 4)}, "
                               "attention_mak=torch.ones(1, 6))")
    assert texts(loaded.notes) == ["attention_mak is not a parameter of Seq2Seq.forward() (did you mean "
                            "'attention_mask'?); it went to **kwargs"]


# ---------------------------------------------------------------------------------------------
# --input


@pytest.mark.parametrize("text, expected", [
    ("1x3x8x8", dict(name=None, shape=(1, 3, 8, 8), dtype=torch.float32)),
    ("input_ids=1x128:int64", dict(name="input_ids", shape=(1, 128), dtype=torch.int64)),
    ("attention_mask=1x128:int64:1", dict(name="attention_mask", dtype=torch.int64, fill=1)),
    ("labels=4:int64:0..10", dict(dtype=torch.int64, low=0, high=10)),
    ("x=2,3:float16:-1..1", dict(shape=(2, 3), dtype=torch.float16, low=-1.0, high=1.0)),
    ("x=2x3::0.5", dict(dtype=torch.float32, fill=0.5)),
    ("keep=2:bool:1", dict(dtype=torch.bool, fill=1)),
])
def test_parse_input(text, expected):
    spec = parse_input(text)
    for key, value in expected.items():
        assert getattr(spec, key) == value, (text, key)


@pytest.mark.parametrize("text, message", [
    ("input-ids=1x8", "'input-ids' is not an input name"),
    ("x=1x8:int64:1:2", "expected [NAME=]SHAPE[:DTYPE[:VALUES]]"),
    ("x=", "expected [NAME=]SHAPE[:DTYPE[:VALUES]]"),
    ("x=1x0", "the shape '1x0' must be positive integers joined by x"),
    ("x=1x8:int46", "unknown input dtype 'int46'"),
    ("x=1x8:int64:0.5", "VALUES '0.5' must be an integer that every element takes, or LOW..HIGH"),
    ("x=1x8:int64:4..4", "LOW..HIGH needs LOW < HIGH"),
    ("x=1x8:float32:a..b", "VALUES 'a..b' must be a number"),
    ("m=1x8:bool:2", "a bool input takes the values 0 or 1"),
])
def test_parse_input_mistakes(text, message):
    with pytest.raises(UserError) as info:
        parse_input(text)
    assert str(info.value).startswith(f"bad --input {text!r}: ") or message.startswith("unknown")
    assert message in str(info.value)


def test_input_flags_are_checked_before_user_code_runs(in_tmp):
    write(in_tmp, "model.py", "raise SystemExit('user code ran')\n")
    assert "not both" in user_error("model.py", inputs=["x=1x8"], input_shapes=[(1, 8)])
    assert "names 'x' more than once" in user_error("model.py", inputs=["x=1x8", "x=1x9"])
    assert "bad --input" in user_error("model.py", inputs=["x=1xy"])


def test_drawn_inputs_follow_their_values_and_default_dtype(in_tmp):
    write(in_tmp, "model.py", """
        from torch import nn

        class Net(nn.Module):
            def forward(self, x, scale=None, labels=None, mask=None):
                return x
    """)
    loaded = load_model("model.py", inputs=["2x64", "scale=2x64:float32:-3..-1", "labels=2x64:int64:5..8",
                                            "mask=2x64:bool:1"], input_dtype="float64")
    (x,) = loaded.args
    assert x.dtype == torch.float64 and 0 <= x.min() and x.max() < 1
    scale, labels, mask = loaded.kwargs["scale"], loaded.kwargs["labels"], loaded.kwargs["mask"]
    assert scale.dtype == torch.float32 and -3 <= scale.min() and scale.max() < -1
    assert set(labels.unique().tolist()) == {5, 6, 7}
    assert mask.dtype == torch.bool and bool(mask.all())
    assert texts(loaded.notes) == []  # nothing drawn that the user did not describe
    again = load_model("model.py", inputs=["2x64", "scale=2x64:float32:-3..-1", "labels=2x64:int64:5..8",
                                           "mask=2x64:bool:1"], input_dtype="float64")
    assert torch.equal(again.args[0], x) and torch.equal(again.kwargs["labels"], labels)


BERT_LIKE = """
    import torch
    from torch import nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.words = nn.Embedding(300, 8)
            self.types = nn.Embedding(2, 8)
            self.positions = nn.Embedding(64, 8)

        def forward(self, input_ids, token_type_ids=None, attention_mask=None):
            flat = input_ids.view(-1, input_ids.shape[-1])  # a view: still the same ids
            positions = torch.arange(flat.shape[-1]).unsqueeze(0)
            h = self.words(flat) + self.types(token_type_ids) + self.positions(positions)
            return h * attention_mask.unsqueeze(-1)
"""


def test_token_ids_stay_below_the_rows_of_the_embedding_that_reads_them(in_tmp):
    write(in_tmp, "model.py", BERT_LIKE)
    loaded = load_model("model.py", inputs=["input_ids=2x64:int64", "token_type_ids=2x64:int64",
                                            "attention_mask=2x64:int64"])
    words, types, mask = (loaded.kwargs[k] for k in ("input_ids", "token_type_ids", "attention_mask"))
    assert 0 <= words.min() and words.max() < 300 and words.max() >= 100  # the whole vocabulary, not a corner
    assert set(types.unique().tolist()) == {0, 1}
    assert set(mask.unique().tolist()) == {0, 1}  # it indexes no table
    assert texts(loaded.notes) == [
        "integer inputs drawn at random: input_ids below 300, the rows of words.weight that it indexes; "
        "token_type_ids below 2, the rows of types.weight that it indexes; attention_mask from {0, 1} "
        "(it indexes no table); --input NAME=SHAPE:DTYPE:VALUES sets them"]
    loaded.inputs.call(loaded.module)
    # positional inputs from --input-shape get the same treatment
    positional = load_model("model.py:Encoder", input_shapes=[(1, 16), (1, 16), (1, 16)], input_dtype="int64")
    assert positional.args[0].max() >= 2 and positional.args[1].max() <= 1
    assert "input 0 below 300" in texts(positional.notes)[0]


def test_token_ids_stay_below_the_rows_of_a_table_indexed_without_an_embedding(in_tmp):
    write(in_tmp, "model.py", """
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.codes = nn.Parameter(torch.randn(40, 4))
                self.register_buffer("bias", torch.zeros(7))

            def forward(self, ids, slots):
                return self.codes[ids] + torch.index_select(self.bias, 0, slots).unsqueeze(-1)
    """)
    loaded = load_model("model.py", inputs=["ids=1x64:int64", "slots=64:int64"])
    assert 2 <= loaded.kwargs["ids"].max() < 40 and 2 <= loaded.kwargs["slots"].max() < 7
    assert "ids below 40, the rows of codes that it indexes; slots below 7, the rows of bias" in texts(loaded.notes)[0]


def test_a_model_that_fails_on_zeros_still_loads(in_tmp):
    write(in_tmp, "model.py", """
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.embed = nn.Embedding(300, 4)

            def forward(self, ids):
                if int(ids.sum()) == 0:
                    raise ValueError("all padding")
                return self.embed(ids)
    """)
    loaded = load_model("model.py", inputs=["ids=1x32:int64"])
    assert set(loaded.kwargs["ids"].unique().tolist()) == {0, 1}
    assert "ids from {0, 1}" in texts(loaded.notes)[0]
