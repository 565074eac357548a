"""PCL900 only when it informs: healthy models whose layers round ordinarily get none, although some
layer always holds the largest share of their output error (probe emulated on the CPU)."""
import pytest
import torch

from preclint.config import Config
from preclint.probe import ProbeOptions, measure_model, merge_into_report
from preclint.predict.ordinary import ordinary_local
from preclint.rules.model.unflagged_hotspot import UnflaggedHotspot
from tests.helpers import check

MODES = ("tf32", "fp16", "bf16")


class TokenModel(torch.nn.Module):
    """A transformers causal LM called with input_ids positionally, returning its logits."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids).logits


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    return TokenModel(GPT2LMHeadModel(config)), (torch.randint(0, 256, (1, 16)),)


def llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         bos_token_id=0, eos_token_id=0)
    return TokenModel(LlamaForCausalLM(config)), (torch.randint(0, 256, (1, 16)),)


def probed(build, modes=MODES):
    model, inputs = build()
    report, graph, ctx = check(model.eval(), inputs, precisions=modes)
    result = measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu"))
    merge_into_report(report, ctx, result, Config(precisions=modes))
    return report, graph, result


@pytest.mark.slow
@pytest.mark.parametrize("build", [gpt2, llama], ids=["gpt2", "llama"])
def test_healthy_models_get_no_hotspot(build):
    report, graph, result = probed(build)
    assert not [f.message for f in report.findings if f.code == "PCL900"]
    # layers holding a fifth of the error, as PCL900 once reported them all; each rounds ordinarily
    large = [(mode, name, m) for mode, measure in result.modes.items() for name, m in measure.nodes.items()
             if (m.contribution or 0) >= 0.2]
    assert large
    for mode, name, m in large:
        ordinary = ordinary_local(graph[name], mode, m.dtype)
        assert m.local.rel_error <= 3 * ordinary, (mode, name, m.local.rel_error, ordinary)


@pytest.mark.slow
def test_the_hotspot_message_gives_the_factor_over_ordinary():
    (bad,) = [e for e in UnflaggedHotspot.probe_bad if "attention" in e.description]
    report, _graph, _result = probed(bad.build, ("bf16",))
    (finding,) = [f for f in report.findings if f.code == "PCL900"]
    assert finding.module == "attn" and finding.severity == "info"
    assert "x what ordinary rounding gives this op" in finding.message


@pytest.mark.slow
def test_an_op_ordinary_rounding_leaves_exact_gets_a_message_without_a_factor():
    # an op that runs in float32 under the precision (or is exact in it) has no ordinary error to divide by
    (bad,) = [e for e in UnflaggedHotspot.probe_bad if "attention" in e.description]
    model, inputs = bad.build()
    report, graph, ctx = check(model.eval(), inputs, precisions=("bf16",))
    result = measure_model(model, inputs, graph, ("bf16",), ProbeOptions(device="cpu"))
    name, m = max(result.modes["bf16"].nodes.items(), key=lambda item: item[1].contribution or 0.0)
    finding = UnflaggedHotspot()._finding(ctx, graph[name], {"bf16": (m, 0.0)}, frozenset())
    assert "where ordinary rounding gives this op none" in finding.message
