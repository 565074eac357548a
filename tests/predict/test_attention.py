"""Rounding inside nn.MultiheadAttention: the fused module is one node of the graph, but its softmax turns
the queries' and keys' rounding into logit errors as large as the logits; the reference pass weighs
each inner rounding by its gradient (reference/analyses/attention.py)."""
import json

import pytest
import torch

from preclint.cli import main
from preclint.reference.analyses.attention import analysable, decomposed
from tests.paths import MODELS



@pytest.mark.parametrize("batch_first,need_weights,average", [(True, True, True), (False, True, False), (True, False, True)])
@pytest.mark.parametrize("mask", ["none", "bool", "float", "padding", "causal"])
def test_decomposition_computes_what_the_module_does(batch_first, need_weights, average, mask):
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(16, 4, batch_first=batch_first).double().eval()
    q = torch.randn(3, 5, 16, dtype=torch.float64)
    kv = torch.randn(3, 7, 16, dtype=torch.float64)
    if not batch_first:
        q, kv = q.transpose(0, 1), kv.transpose(0, 1)
    kwargs = {"need_weights": need_weights, "average_attn_weights": average}
    if mask == "bool":
        kwargs["attn_mask"] = torch.rand(5, 7) < 0.3
        kwargs["attn_mask"][:, 0] = False  # (no query sees no key)
    elif mask == "float":
        kwargs["attn_mask"] = torch.randn(5, 7, dtype=torch.float64)
    elif mask == "padding":
        kwargs["key_padding_mask"] = torch.zeros(3, 7, dtype=torch.bool)
        kwargs["key_padding_mask"][1, 4:] = True
    elif mask == "causal":
        kv = q  # self-attention: a causal mask is square
        kwargs["attn_mask"] = torch.ones(5, 5, dtype=torch.bool).triu(1)
        kwargs["is_causal"] = True
    expected = module(q, kv, kv, **kwargs)
    output, weights, sites = decomposed(module, q, kv, kv, **kwargs)
    torch.testing.assert_close(output, expected[0], rtol=1e-10, atol=1e-12)
    if need_weights:
        torch.testing.assert_close(weights, expected[1], rtol=1e-10, atol=1e-12)
    assert set(sites) == {"inputs", "weights", "operands", "scores"}


def test_unlike_modules_are_left_to_the_boundary():
    module = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True).eval()
    x = torch.randn(4, 1, 8)
    assert not analysable(module, (x, x, x), {})
    assert analysable(torch.nn.MultiheadAttention(8, 2).eval(), (x, x, x), {})
    assert not analysable(torch.nn.MultiheadAttention(8, 2, dropout=0.1).train(), (x, x, x), {})


@pytest.mark.slow
def test_modulated_attention_error_is_predicted(tmp_path, capsys):
    # Before: bf16 predicted 0.0129 (the module's boundary rounded once) against 0.0646 measured (5.0x
    # under), tf32 0.00118 against 0.00397; the queries' and keys' rounding moves large logits inside.
    path = tmp_path / "dit.py"
    path.write_text((MODELS / "dit_block.py").read_text())
    code = main(["check", str(path), "--precision", "bf16,tf32", "--probe", "cpu", "--output-format", "json",
                 "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    report = json.loads(out)
    for mode in ("bf16", "tf32"):
        figures = report["summary"][mode]
        predicted, measured = figures["predicted_output"]["rel_error"], figures["measured_output"]["rel_error"]
        # within the 3x the error model is held to: bf16 0.73x of the measurement; TF32 2.2x over the
        # CPU emulation (0.00225), 1.7x over an H100's own TF32 kernels (0.00282,
        # benchmarks/results/model_classes_families_cuda.json)
        assert measured / 3 <= predicted <= measured * 3, (mode, predicted, measured)
    assert not any("without gradients" in note for note in report["notes"])
