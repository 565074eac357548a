"""Weights files read where they lie: safetensors and torch.save state dicts, memory-mapped; a model
built on the meta device takes the file's tensors without a second copy."""
import textwrap

import pytest
import torch

from preclint.load.checkpoints import read_safetensors
from preclint.load.loader import load_model
from tests.load.test_load import fixture, user_error

META_MODEL = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.register_buffer("shift", torch.zeros(4), persistent={persistent})

    def forward(self, x):
        return self.body(x) + self.shift

def build():
    with torch.device("meta"):
        return Net()

example_inputs = (torch.randn(2, 8),)
"""


def save_safetensors(tensors, path):
    safetensors = pytest.importorskip("safetensors.torch")
    safetensors.save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def test_safetensors_are_views_of_the_file(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int64), "c": torch.randn(4).to(torch.bfloat16),
               "d": torch.tensor([True, False])}
    save_safetensors(tensors, tmp_path / "w.safetensors")
    read = read_safetensors(str(tmp_path / "w.safetensors"))
    assert set(read) == set(tensors)
    for key, value in tensors.items():
        assert read[key].dtype == value.dtype and torch.equal(read[key], value), key
    # all in one mapping of the file: no tensor has memory of its own
    assert len({read[k].untyped_storage().data_ptr() for k in ("a", "b")}) == 1


def test_weights_from_safetensors_round_trip(tmp_path, trained_state_dict):
    save_safetensors(trained_state_dict, tmp_path / "weights.safetensors")
    loaded = load_model(fixture("blocks_and_net.py"), weights=str(tmp_path / "weights.safetensors"))
    for key, value in loaded.module.state_dict().items():
        assert torch.equal(value, trained_state_dict[key]), key


@pytest.mark.parametrize("fmt", ["safetensors", "pt"])
def test_a_meta_model_takes_the_file_tensors_as_its_own(tmp_path, fmt):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(META_MODEL.format(persistent=True)))
    torch.manual_seed(3)
    state = {"body.0.weight": torch.randn(16, 8), "body.0.bias": torch.randn(16), "body.2.weight": torch.randn(4, 16),
             "body.2.bias": torch.randn(4), "shift": torch.randn(4)}
    weights = tmp_path / f"weights.{fmt}"
    if fmt == "pt":
        torch.save(state, weights)
    else:
        save_safetensors(state, weights)
    loaded = load_model(str(path), model="build", weights=str(weights))
    params = dict(loaded.module.named_parameters())
    assert not any(p.is_meta for p in params.values())
    for key, value in state.items():
        assert torch.equal(loaded.module.state_dict()[key], value)
    # memory-mapped: the parameters live in the file's pages, not in memory of their own
    assert params["body.0.weight"].untyped_storage().nbytes() >= weights.stat().st_size - 4096
    with torch.no_grad():
        expected = torch.nn.functional.linear(torch.relu(torch.nn.functional.linear(
            loaded.args[0], state["body.0.weight"], state["body.0.bias"])), state["body.2.weight"], state["body.2.bias"])
        assert torch.allclose(loaded.module(*loaded.args), expected + state["shift"])


def test_a_meta_model_without_weights_or_with_a_missing_buffer_is_one_clear_error(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent(META_MODEL.format(persistent=False)))
    message = user_error(str(path), model="build")
    assert "on the meta device" in message and "--weights" in message
    state = {"body.0.weight": torch.randn(16, 8), "body.0.bias": torch.randn(16), "body.2.weight": torch.randn(4, 16),
             "body.2.bias": torch.randn(4)}
    torch.save(state, tmp_path / "w.pt")
    message = user_error(str(path), model="build", weights=str(tmp_path / "w.pt"))
    assert "shift stay on the meta device" in message


def test_a_file_that_claims_to_be_safetensors_but_is_not(tmp_path):
    path = tmp_path / "broken.safetensors"
    path.write_bytes((20).to_bytes(8, "little") + b"{not json at all....")
    message = user_error(fixture("blocks_and_net.py"), weights=str(path))
    assert "broken.safetensors: cannot be read as safetensors" in message and "\n" not in message


LOSSLESS_MODEL = """
import torch
from torch import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        return self.body(x)

def build():
    {build}

example_inputs = (torch.randn(2, 4),)
"""


def _lossless_model(tmp_path, meta: bool):
    path = tmp_path / "model.py"
    build = 'with torch.device("meta"):\n        return Net()' if meta else "return Net()"
    path.write_text(textwrap.dedent(LOSSLESS_MODEL).replace("{build}", build))
    return str(path)


def _state(**changed):
    torch.manual_seed(0)
    state = {"body.weight": torch.randn(2, 4), "body.bias": torch.randn(2), "steps": torch.tensor(7)}
    state.update(changed)
    return state


@pytest.mark.parametrize("meta", [False, True])
@pytest.mark.parametrize("changed, expected", [
    ({"body.weight": torch.randn(2, 4) + 1j * torch.rand(2, 4)}, "body.weight (complex64 to float32: its imaginary part would be dropped)"),
    ({"body.bias": torch.tensor([1e300, 0.0], dtype=torch.float64)}, "body.bias (float64 to float32: values beyond its range)"),
    ({"steps": torch.tensor(7.5)}, "steps (float32 to int64: fractions)"),
    ({"steps": torch.tensor(float("nan"))}, "steps (float32 to int64: inf or NaN)"),
    ({"steps": torch.tensor(2 ** 40, dtype=torch.int64).to(torch.float64) * 2 ** 30}, "steps (float64 to int64: values beyond its range)"),
])
def test_a_checkpoint_the_model_cannot_hold_without_loss_is_one_clear_line(tmp_path, meta, changed, expected):
    """A complex checkpoint for float32 parameters was loaded with its imaginary part dropped, silently."""
    torch.save(_state(**changed), tmp_path / "w.pt")
    message = user_error(_lossless_model(tmp_path, meta), model="build", weights=str(tmp_path / "w.pt"))
    assert expected in message and "cannot hold the checkpoint's values" in message, message


@pytest.mark.parametrize("changed", [
    {"body.weight": torch.randn(2, 4, dtype=torch.float64)},  # rounding to float32 is what such a load means
    {"body.weight": (torch.randn(2, 4) + 0j).to(torch.complex64)},  # no imaginary part to lose
    {"steps": torch.tensor(7.0)},  # a whole number stored as a float
])
def test_a_checkpoint_cast_without_loss_loads(tmp_path, changed):
    torch.save(_state(**changed), tmp_path / "w.pt")
    loaded = load_model(_lossless_model(tmp_path, False), model="build", weights=str(tmp_path / "w.pt"))
    assert loaded.module.body.weight.dtype == torch.float32 and int(loaded.module.steps) == 7


@pytest.mark.slow
def test_the_command_line_says_it_in_one_line_with_exit_2(tmp_path):
    import subprocess
    import sys

    torch.save(_state(**{"body.weight": torch.randn(2, 4) + 1j}), tmp_path / "complex.pt")
    done = subprocess.run([sys.executable, "-m", "preclint", "check", _lossless_model(tmp_path, False), "--model",
                           "build", "--weights", str(tmp_path / "complex.pt")], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "imaginary part would be dropped" in done.stderr
