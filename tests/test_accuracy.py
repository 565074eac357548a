"""The accuracy benchmark's code, on a mini zoo: measuring, predicting, comparing and reporting.

The full zoo runs outside the test suite (python -m benchmarks.accuracy, see benchmarks/README.md);
these tests keep its code honest and check that predictions hold on two small transformer blocks.
"""
import dataclasses

import torch

from benchmarks import accuracy
from benchmarks.zoo import BY_NAME, fingerprint


def test_tf32_rounding_keeps_10_mantissa_bits_ties_to_even():
    x = torch.tensor([1.0, 1.0 + 2.0**-10, 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-12, -2049.0, 3.0e38])
    expected = torch.tensor([1.0, 1.0 + 2.0**-10, 1.0, 1.0 + 2.0**-9, 1.0, -2048.0, 3.0e38])
    rounded = accuracy.round_tf32(x)
    assert torch.equal(rounded[:-1], expected[:-1])
    assert torch.isfinite(rounded[-1])
    assert torch.equal(accuracy.round_tf32(torch.tensor([float("inf")])), torch.tensor([float("inf")]))


def test_tf32_emulation_rounds_the_operands_of_matmuls_only():
    torch.manual_seed(0)
    a, b = torch.randn(16, 64), torch.randn(64, 16)
    with accuracy.Tf32Emulation():
        product = a @ b
        total = a + 1e-5
    assert torch.allclose(product, accuracy.round_tf32(a) @ accuracy.round_tf32(b), rtol=0, atol=1e-5)
    assert not torch.equal(product, a @ b)
    assert torch.equal(total, a + 1e-5)


def test_the_emulated_autocast_runs_in_float32_what_the_predictions_say_it_does():
    """The benchmark's CPU stand-in for CUDA autocast and the predictions read one list of the ops
    autocast runs in float32 (numerics.AUTOCAST_FP32), functions that decompose on the way included."""
    import torch.nn.functional as F

    from preclint.core.numerics import autocast_policy

    x = torch.randn(4, 8)
    target = torch.tensor([1, 0, 3, 2])
    ops = {
        "softmax": lambda v: F.softmax(v, dim=-1),
        "layer_norm": lambda v: F.layer_norm(v, (8,)),
        "normalize": lambda v: F.normalize(v, dim=-1),
        "cross_entropy": lambda v: F.cross_entropy(v, target),
        "interpolate": lambda v: F.interpolate(v[None], scale_factor=2.0),
    }
    for name, op in ops.items():
        assert autocast_policy(name) == "fp32", name
        with torch.autocast("cpu", dtype=torch.bfloat16), accuracy.CudaAutocastLists(torch.bfloat16):
            out = op(x.bfloat16())
        assert out.dtype == torch.float32, name


def test_fingerprint_is_stable_and_tells_models_apart():
    one = BY_NAME["mlp_block"].build()
    again = BY_NAME["mlp_block"].build()
    other = BY_NAME["tiny_gpt"].build()
    assert fingerprint(*one) == fingerprint(*again) != fingerprint(*other)


def test_mini_zoo_predictions_hold_against_measurement():
    entries = [dataclasses.replace(BY_NAME["mlp_block"], ranking="transformer"), BY_NAME["tiny_gpt"]]
    measured = accuracy.measure(entries[:1], "cpu", ranking=True, log=lambda *_: None)
    measured["models"].update(accuracy.measure(entries[1:], "cpu", ranking=False, log=lambda *_: None)["models"])
    predicted = accuracy.predict_all(entries, log=lambda *_: None)
    result = accuracy.compare(predicted, measured)
    summary = result["summary"]
    assert summary["pairs"] == 2 * len(accuracy.MODES)
    assert summary["within"] == summary["pairs"], result["pairs"]
    assert summary["nonfinite_measured"] == 0 and summary["false_alarms"] == 0
    for mode, hits in summary["ranking_mean_hits"].items():
        assert hits >= 3, (mode, result["ranking"])
    text = accuracy.report(predicted, [measured])
    assert "within 3x of measured" in text and "| mlp_block |" in text and "One layer at a time" in text


def test_compare_counts_overflow_outcomes_and_noise_floors():
    predicted = {"models": {"m": {"fingerprint": "f", "modes": {
        "fp16": {"rel_error": None, "finite": False, "unit_shares": {}},
        "bf16": {"rel_error": 1e-12, "finite": True, "unit_shares": {}},
        "tf32": {"rel_error": None, "finite": False, "unit_shares": {}},
    }}}}
    measured = {"machine": {"torch": "x"}, "models": {"m": {"fingerprint": "f", "fp32_rel_error": 1e-9, "modes": {
        "fp16": {"finite": True, "rel_error": 0.99},  # an inf divided away: destroyed, not inf
        "bf16": {"finite": True, "rel_error": 2e-9},  # both below the fp32 noise floor
        "tf32": {"finite": True, "rel_error": 1e-3},  # predicted to overflow, but it did not
    }}}}
    summary = accuracy.compare(predicted, measured)["summary"]
    assert summary["nonfinite_measured"] == 1 and summary["nonfinite_predicted"] == 1
    assert summary["false_alarms"] == 1
    assert summary["within"] == 1  # bf16
