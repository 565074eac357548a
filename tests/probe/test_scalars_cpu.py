"""The CPU's figures by the faster paths (probe/scalars.py) are the numbers the plain ones give: the
largest magnitude by aminmax as vector_norm's inf norm, a difference of two dtypes widened first as
torch.sub's own promotion."""
import math

import pytest
import torch

from preclint.probe.scalars import Scalars, difference


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("special", [None, math.inf, -math.inf, math.nan])
def test_the_largest_magnitude_is_the_inf_norm(dtype, special):
    torch.manual_seed(0)
    t = (torch.randn(3, 50) * 7).to(dtype)
    t[1, 3] = -40.0  # the largest magnitude is a negative value
    if special is not None:
        t[2, 7] = special
    scalars = Scalars()
    l2, largest = scalars.norms(t)
    scalars.resolve()
    wide = torch.float32 if dtype in (torch.float16, torch.bfloat16) else None
    expected = (torch.linalg.vector_norm(t, dtype=wide), torch.linalg.vector_norm(t, math.inf, dtype=wide))
    for slot, value in zip((l2, largest), expected):
        got, want = scalars[slot], float(value)
        assert (math.isnan(got) and math.isnan(want)) or got == want


@pytest.mark.parametrize("low", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("reference", [torch.float32, torch.float64])
def test_a_difference_of_two_dtypes_is_the_promoted_subtraction(low, reference):
    torch.manual_seed(0)
    b = torch.randn(1000, dtype=reference)
    a = b.to(low)
    out = torch.empty(a.shape, dtype=torch.float32)
    assert torch.equal(difference(a, b, torch.float32), torch.sub(a, b, out=out))
