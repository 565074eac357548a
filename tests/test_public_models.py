"""Public model families as a user brings them (random weights, tiny configs): the failures the coverage
benchmark (benchmarks/coverage.py) found, each reproduced on the model that showed it."""
import pytest
import torch

from preclint.probe import ProbeOptions, measure_model
from tests.helpers import check

transformers = pytest.importorskip("transformers")


def probe(model, inputs, modes=("fp16", "bf16")):
    report, graph, ctx = check(model, inputs, precisions=modes)
    return report, measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu"), None)


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


def test_gpt2_with_upcast_attention_is_measured():
    # reorder_and_upcast_attn asserts float32 attention weights, so the reference runs in float32,
    # where the norm of the causal mask (finfo(float32).min) overflows
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=1, n_head=4,
                                     reorder_and_upcast_attn=True, attn_implementation="eager")
    _report, result = probe(Logits(transformers.GPT2LMHeadModel(config)).eval(), (torch.randint(0, 256, (1, 16)),))
    assert any("cannot run in float64" in n for n in result.notes), result.notes
    for mode, measure in result.modes.items():
        assert measure.error is None, (mode, measure.error)
        assert 0 < measure.output.rel_error < 0.05, (mode, measure.output)
