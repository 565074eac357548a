"""What train mode does to a compared output (preclint/testing/modes.py): batch statistics, dropout;
the model, its running statistics and the random state are left as they were."""
from __future__ import annotations

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
