"""The accuracy benchmark's code, on a mini zoo: measuring, predicting, comparing and reporting.

The full zoo runs outside the test suite (python -m benchmarks.accuracy, see benchmarks/README.md);
these tests keep its code honest and check that predictions hold on two small transformer blocks.
Its modes run through preclint.measure, whose emulation test_measure.py tests.
"""
import pytest
import dataclasses

from benchmarks import accuracy
from benchmarks.zoo import BY_NAME, fingerprint


@pytest.mark.slow
def test_fingerprint_is_stable_and_tells_models_apart():
    one = BY_NAME["mlp_block"].build()
    again = BY_NAME["mlp_block"].build()
    other = BY_NAME["tiny_gpt"].build()
    assert fingerprint(*one) == fingerprint(*again) != fingerprint(*other)


@pytest.mark.slow
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
