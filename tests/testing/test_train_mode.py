"""What train mode does to a compared output (preclint/testing/modes.py): batch statistics, dropout;
the model, its running statistics and the random state are left as they were."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from preclint.load.modelio import Inputs
from preclint.testing.modes import train_mode_effect


def _net(*middle):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), *middle, nn.ReLU(), nn.Linear(16, 4))


def test_batch_statistics_change_the_output_and_are_deterministic():
    model = _net(nn.BatchNorm1d(16))
    x = Inputs((torch.randn(6, 8),))
    running = model[1].running_mean.clone()
    state = torch.get_rng_state()
    effect = train_mode_effect(model, x)
    assert effect is not None and not effect.random and effect.spread == 0.0
    assert effect.batch_statistics == ("1 (BatchNorm1d)",)
    # the model's running statistics and mode, and the random state, are as they were
    assert torch.equal(model[1].running_mean, running) and model.training and torch.equal(torch.get_rng_state(), state)
    assert train_mode_effect(model.eval(), x) is None


def test_dropout_is_random_and_a_model_whose_mode_changes_nothing_has_no_effect():
    effect = train_mode_effect(_net(nn.Dropout(0.5)), Inputs((torch.randn(6, 8),)))
    assert effect.random and effect.spread > 0.1 and effect.random_modules == ("1 (Dropout)",)
    assert train_mode_effect(_net(nn.Dropout(0.0)), Inputs((torch.randn(6, 8),))) is None
    assert train_mode_effect(_net(), Inputs((torch.randn(6, 8),))) is None  # train mode, and nothing it changes


def _bf16(model, x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(x).float()


@pytest.mark.slow
def test_assert_close_judges_a_train_mode_model_in_train_mode():
    """In eval mode (its initial running statistics) the batch norm passes small inputs through; in train
    mode it scales them up 100x: the eval-mode tolerance called bf16's own error a real change."""
    import copy

    import preclint.testing

    model = _net(nn.BatchNorm1d(16))
    x = torch.randn(8, 8) * 0.01 + 0.05
    expected = copy.deepcopy(model)(x).detach()
    actual = _bf16(model, x)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(actual, expected)
    preclint.testing.assert_close(actual, expected, model=model, inputs=x, precision="bf16")
    with pytest.raises(AssertionError, match="a real change"):
        eval_tolerance = preclint.testing.tolerance(model, x, "bf16")
        preclint.testing.assert_close(actual, expected, model=model, inputs=x, precision="bf16", tolerance=eval_tolerance)


def test_assert_close_says_dropout_makes_the_comparison_not_deterministic():
    import preclint.testing

    model = _net(nn.Dropout(0.5))
    x = torch.randn(8, 8)
    expected = model(x).detach()
    with pytest.raises(AssertionError, match="The comparison is not deterministic"):
        preclint.testing.assert_close(_bf16(model, x), expected, model=model, inputs=x, precision="bf16")
