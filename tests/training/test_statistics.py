"""The statistics of a training step's tensors in a format, checked against what torch's own casts do."""
import math

import torch

from preclint.training.statistics import (block_scales, flush_threshold, flushes, lost_update_fraction, lost_updates,
                                          magnitudes, nonfinite_count, overflows, relative_error, scale_window,
                                          underflow_fraction, unchanged_fraction)


def test_flushes_where_torch_stores_zero():
    values = torch.logspace(-12, -3, 2001, dtype=torch.float64) * torch.tensor([1.0, -1.0]).repeat(1001)[:2001]
    for dtype in (torch.float16, torch.bfloat16):
        truth = (values.to(dtype) == 0) & (values != 0)
        assert torch.equal(flushes(values, dtype), truth), dtype
    assert flush_threshold(torch.float16) == 2.0 ** -25


def test_underflow_fraction_at_a_loss_scale():
    values = torch.tensor([1e-9, 1e-8, 1e-3, 0.0], dtype=torch.float64)
    assert underflow_fraction(values, torch.float16) == 2 / 3
    assert underflow_fraction(values, torch.float16, scale=2.0 ** 16) == 0.0


def test_overflows_where_torch_stores_inf():
    values = torch.tensor([65504.0, 65519.0, 65520.0, 1e6], dtype=torch.float64)
    assert overflows(values, torch.float16).tolist() == [not math.isfinite(float(v)) for v in values.half()]


def test_lost_updates_are_those_that_round_back_to_the_weight():
    weight = torch.ones(4, dtype=torch.float64)
    update = torch.tensor([1e-4, 1e-2, 0.0, -3e-3], dtype=torch.float64)
    lost = lost_updates(weight, update, torch.bfloat16)
    assert lost.tolist() == [True, False, False, False]  # bf16 spacing at 1 is 2^-7; half of it 3.9e-3 (below 1: 1.95e-3)
    assert lost_update_fraction(weight, update, torch.bfloat16) == 1 / 3
    assert lost_update_fraction(weight, update, torch.float32) == 0.0


def test_unchanged_fraction_counts_weights_a_float64_step_moves():
    before = torch.zeros(4)
    after = torch.tensor([0.0, 1.0, 0.0, 0.0])
    reference = torch.tensor([1.0, 1.0, 0.0, 1.0], dtype=torch.float64)
    assert unchanged_fraction(before, after, reference) == 2 / 3


def test_magnitudes_count_below_a_power_of_two_exactly():
    values = torch.tensor([2.0 ** -30, 2.0 ** -26, 2.0 ** -25, 3e-8, 1.0, 0.0], dtype=torch.float64)
    spread = magnitudes(values)
    assert spread.nonzero == 5 and spread.largest == 1.0 and spread.smallest == 2.0 ** -30
    assert spread.below(2.0 ** -25) == int((values.abs() < 2.0 ** -25).sum() - (values == 0).sum())


def test_scale_window_and_errors():
    low, high = scale_window(largest=10.0, smallest_kept=1e-9, dtype=torch.float16)
    assert high == 4096.0 and 10.0 * high < 65504 < 10.0 * high * 2
    assert low is not None and 1e-9 * low >= 2.0 ** -24 > 1e-9 * low / 2
    assert relative_error(torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 1.0])) == math.inf
    assert nonfinite_count(torch.tensor([1.0, float("nan"), float("inf")])) == 2


def test_block_scales_say_which_blocks_are_empty():
    values = torch.cat([torch.zeros(32), torch.ones(32) * 3, torch.ones(32)])
    stats = block_scales(values, block=32)
    assert (stats.blocks, stats.amax_min, stats.amax_median, stats.zero_blocks) == (3, 0.0, 1.0, 1)
