"""A forward that stores its recurrent state in place into a state tensor the caller passes (as
transformers' RWKV does, layer by layer): every probe run reads the inputs as they were given, and a
backward pass that the in-place store breaks costs the contributions, not the modes' figures. Before,
the float64 reruns read the state the first run had stored ("not deterministic", 0.0185 apart) and
every mode failed with "modified by an inplace operation"."""
import pytest
import torch
from torch import nn

import preclint


class StoredState(nn.Module):
    """A loop over tokens whose running sums are stored, at the end, into this layer's slot of ``state``."""

    def __init__(self, dim=16):
        super().__init__()
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, state):
        k, v = torch.sigmoid(self.key(x)), self.value(x)
        num, den = state[0], state[1]
        out = torch.zeros_like(v)
        for t in range(x.shape[1]):
            num, den = 0.9 * num + k[:, t] * v[:, t], 0.9 * den + k[:, t]
            out[:, t] = num / (den + 1.0)
        state[0] = num
        state[1] = den
        return self.out(out), state


@pytest.mark.slow
def test_a_state_stored_in_place_is_measured_in_every_mode():
    torch.manual_seed(0)
    x, state = torch.randn(2, 12, 16), torch.rand(2, 2, 16)
    given = state.clone()
    modes = ("tf32", "fp16", "bf16-full")
    report = preclint.check(StoredState().eval(), preclint.inputs(x, state), precisions=modes, probe="cpu")
    document = report.to_dict()
    assert torch.equal(state, given)  # the caller's tensor is left as it was
    for mode in modes:
        measured = document["summary"][mode]["measured_output"]
        assert "error" not in measured, measured
        assert 0 < measured["outputs"][0]["rel_error"] < 0.05
    assert not any("not deterministic" in note for note in document["notes"])
