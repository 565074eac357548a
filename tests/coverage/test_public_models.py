"""Public model families as a user brings them (random weights, tiny configs): the failures the coverage
benchmark (benchmarks/coverage.py) found, each reproduced on the model that showed it."""
import json

import pytest
import torch

from preclint.core.notes import texts
from preclint.cli import main

from preclint.probe import ProbeOptions, measure_model
from tests.helpers import check

transformers = pytest.importorskip("transformers")


def probe(model, inputs, modes=("fp16", "bf16")):
    report, graph, ctx = check(model, inputs, precisions=modes)
    return report, measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu"), None)


def assert_every_precision_measured(tmp_path, capsys, name, source):
    """`preclint check FILE --probe cpu` on a model file: a report, with every precision measured."""
    path = tmp_path / name
    path.write_text(source)
    code = main(["check", str(path), "--probe", "cpu", "--output-format", "json"])
    out, err = capsys.readouterr()
    assert code in (0, 1), err
    for mode, entry in json.loads(out)["summary"].items():
        assert "error" not in entry["measured_output"], (mode, entry["measured_output"])


class Logits(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids).logits


@pytest.mark.slow
def test_gpt2_with_upcast_attention_is_measured():
    # reorder_and_upcast_attn asserts float32 attention weights, so the reference runs in float32,
    # where the norm of the causal mask (finfo(float32).min) overflows
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=1, n_head=4,
                                     reorder_and_upcast_attn=True, attn_implementation="eager")
    _report, result = probe(Logits(transformers.GPT2LMHeadModel(config)).eval(), (torch.randint(0, 256, (1, 16)),))
    assert any("cannot run in float64" in n for n in texts(result.notes)), texts(result.notes)
    for mode, measure in result.modes.items():
        assert measure.error is None, (mode, measure.error)
        assert 0 < measure.output.rel_error < 0.05, (mode, measure.output)


MIXTRAL = '''
import torch
import transformers

torch.manual_seed(0)
config = transformers.MixtralConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                    num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                    num_experts_per_tok=2)
model = transformers.MixtralForCausalLM(config).eval()
example_inputs = {"input_ids": torch.randint(0, 256, (2, 32))}
'''


@pytest.mark.slow
def test_mixture_of_experts_is_checked_and_probed(tmp_path, capsys):
    # the router normalises its float32 top-k weights in place after summing them: the reference kept
    # for the sum's operand was overwritten, its local error read as 0.84 and PCL900, dividing it by
    # the ordinary error of a float32 op (zero), ended in an internal error
    assert_every_precision_measured(tmp_path, capsys, "mixtral.py", MIXTRAL)


PEGASUS = '''
import torch
import transformers

torch.manual_seed(0)
config = transformers.PegasusConfig(vocab_size=256, d_model=64, encoder_layers=1, decoder_layers=1,
                                    encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                                    decoder_ffn_dim=128, max_position_embeddings=64)
model = transformers.PegasusForConditionalGeneration(config).eval()
example_inputs = {"input_ids": torch.randint(0, 256, (2, 16)), "decoder_input_ids": torch.randint(0, 256, (2, 8))}
'''


@pytest.mark.slow
def test_a_weight_the_model_takes_out_of_autograd_is_no_gradient_leaf(tmp_path, capsys):
    # Pegasus's sinusoidal position table stops requiring gradients as the model runs
    assert_every_precision_measured(tmp_path, capsys, "pegasus.py", PEGASUS)
