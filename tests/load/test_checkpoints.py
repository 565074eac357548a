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
