"""Two ledgers compared (preclint/diff/ledgers.py): the gap's fractions, the local and inherited split,
and the sentence at the top."""
from __future__ import annotations

import pytest

from preclint.diff.ledgers import Ledger, LayerRow, compare_ledgers, group_depth


def _ledger(error, rows):
    return Ledger("fp16", error, {name: LayerRow(name, module, "nn.Conv2d", "conv", None, local, received, share)
                                  for name, module, local, received, share in rows}, measured=True)


def test_the_layers_that_grew_account_for_the_gap_and_the_sentence_names_their_group():
    a = _ledger(1e-3, [("stem", "stem", 5e-4, 5e-4, 0.5), ("l3c", "layer3.conv", 5e-4, 7e-4, 0.5)])
    # B: 10x the error, the growth all in layer3 (its share of 100x the squared error)
    b = _ledger(1e-2, [("stem", "stem", 5e-4, 5e-4, 0.005), ("l3c", "layer3.conv", 5e-4, 1e-2, 0.995)])
    stats = {"l3c": {"folded_scale": (1.0, 45.0), "activation_absmax": (3.0, 300.0)}}
    diff = compare_ledgers(a, b, ("A", "B"), stats)
    assert diff.ratio == pytest.approx(10.0)
    top = diff.layers[0]
    assert top.node == "l3c"
    gap = 1e-4 - 1e-6
    assert top.of_gap == pytest.approx((0.995 * 1e-4 - 0.5 * 1e-6) / gap)
    assert sum(layer.of_gap for layer in diff.layers) == pytest.approx(1.0)
    assert top.own == pytest.approx((5e-4 / 1e-2) ** 2)  # it mostly passes on what it receives
    assert diff.sentence.startswith("B's fp16 error is 10x A's")
    assert "100% of the difference comes from layer3" in diff.sentence
    assert "B's folded batch-norm scales reach 45 (A's: 1)" in diff.sentence
    assert "activations reach 300 (A's: 3)" in diff.sentence


def test_the_first_model_can_be_the_worse_one():
    a = _ledger(4e-3, [("x", "a", 1e-3, 4e-3, 1.0)])
    b = _ledger(1e-3, [("x", "a", 1e-3, 1e-3, 1.0)])
    diff = compare_ledgers(a, b, ("A", "B"))
    assert diff.worse == 0 and diff.layers[0].of_gap == pytest.approx(1.0)
    assert diff.sentence.startswith("A's fp16 error is 4x B's")


def test_errors_alike_are_said_to_be_alike():
    a = _ledger(1.00e-3, [("x", "a", 1e-3, 1e-3, 1.0)])
    b = _ledger(1.05e-3, [("x", "a", 1e-3, 1e-3, 1.0)])
    assert "alike" in compare_ledgers(a, b, ("A", "B")).sentence


def test_a_ledger_that_could_not_be_measured_is_said_so():
    a = _ledger(1e-3, [])
    b = Ledger("fp16", None, {}, True, "out of memory on cuda:0")
    diff = compare_ledgers(a, b, ("A", "B"))
    assert diff.error == "out of memory on cuda:0" and "not compared" in diff.sentence


def test_modules_group_where_the_model_splits_in_three():
    assert group_depth(["stem", "layer1.0.conv1", "layer2.0.conv1", "fc"]) == 1
    assert group_depth(["features.0", "features.3", "features.6"]) == 2
