"""PCL501 tolerance-below-resolution: a closeness check tighter than the precision the code runs in."""
from __future__ import annotations

from typing import Iterator, Optional, Tuple

import libcst as cst

from preclint.core.findings import Finding
from preclint.core.numerics import FP16, Format
from preclint.core.tolerances import ONE_OP_NUMEL, RTOL_UNITS, one_op, resolution
from preclint.rules.base import SourceRule
from preclint.text.args import argument
from preclint.text.index import dotted_name, number

# qualified name -> (position of rtol, position of atol, default rtol, default atol); a default of
# None means the function picks its tolerances from the dtype (assert_close): nothing to judge then.
CHECKS = {
    "torch.testing.assert_close": (None, None, None, None),
    "torch.testing.assert_allclose": (2, 3, None, None),
    "torch.allclose": (2, 3, 1e-5, 1e-8),
    "torch.isclose": (2, 3, 1e-5, 1e-8),
    "numpy.allclose": (2, 3, 1e-5, 1e-8),
    "numpy.isclose": (2, 3, 1e-5, 1e-8),
    "numpy.testing.assert_allclose": (2, 3, 1e-7, 0.0),
}
METHODS = {"allclose": (1, 2, 1e-5, 1e-8), "isclose": (1, 2, 1e-5, 1e-8)}  # tensor.allclose(other, ...)
# callees known only by name (a project's own helper): judged on explicit arguments alone
NAMES = ("assert_allclose", "assert_close", "allclose", "isclose")

# The tolerance a precision can meet (preclint.core.tolerances, which preclint.testing uses for whole
# models too): a correct result in a format with unit roundoff u differs from the fp32/fp64 reference
# by about u relative to its own size where there is no cancellation, and by one op's error times
# the typical magnitude of the values where there is; an rtol below the format's resolution (2u)
# fails a correct result outright.
HONEST = one_op(1.0)  # in units of u: rtol = HONEST.rtol * u, atol = HONEST.atol * u * RMS(values)


# the parameters that hold the compared values, by keyword, in the checks above and users' helpers
VALUE_KEYWORDS = ("actual", "expected", "desired", "input", "other", "a", "b", "x", "y", "a1", "a2")
# calls whose result is an integer tensor (or a count), by method or function name
INTEGER_CALLS = frozenset(
    """argmax argmin argsort argwhere nonzero count_nonzero bincount searchsorted bucketize randint
    randperm long int short char byte bool numel unique_consecutive""".split()
)
INTEGER_DTYPES = frozenset(
    f"{module}.{name}" for module in ("torch", "numpy")
    for name in "int8 int16 int32 int64 uint8 long int short bool bool_ intp".split()
)


def _compared(site) -> list:
    """The expressions a check compares: its first two positional arguments (or the receiver and
    the first one for ``a.allclose(b)``) and the value keywords."""
    call = site.node
    values = [arg.value for arg in call.args if arg.keyword is None and not arg.star][:2]
    values += [arg.value for arg in call.args if arg.keyword is not None and arg.keyword.value in VALUE_KEYWORDS]
    if site.method in METHODS and isinstance(call.func, cst.Attribute):
        values = [call.func.value] + values[:1]
    return values


def _integer_valued(node, site, index, depth: int = 0) -> bool:
    """Whether the source shows ``node`` holds integers: an index or count op (``argmax``,
    ``.long()``, ``.indices``), an integer dtype, or a name assigned only such values here."""
    if node is None or depth > 3:
        return False
    if isinstance(node, cst.Attribute) and node.attr.value in ("indices", "shape"):
        return True
    if isinstance(node, cst.Call):
        func = node.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (func.value if isinstance(func, cst.Name) else "")
        if name in INTEGER_CALLS:
            return True
        dtype = argument(node, "dtype", None)
        if name in ("to", "type", "astype") and node.args:
            dtype = dtype or node.args[0].value
        if dtype is not None and index.qualify(dotted_name(dtype), site) in INTEGER_DTYPES:
            return True
        return False
    if isinstance(node, cst.Name):
        assigned = index.assigned_in(node.value, site.scope)
        return bool(assigned) and all(_integer_valued(a.value, site, index, depth + 1) for a in assigned)
    return False


class ToleranceBelowResolution(SourceRule):
    code = "PCL501"
    name = "tolerance-below-resolution"
    summary = "A closeness check is tighter than the precision the compared values are computed in."
    severity = "warning"
    precisions = ("tf32", "fp16", "bf16")
    # a check to judge, and some sign of reduced precision (see preclint.text.evidence)
    triggers = (
        ("allclose", "assert_close", "isclose"),
        ("half", "float16", "bfloat16", "autocast", "tf32", "TF32", "FP16", "BF16", "float32_matmul_precision",
         "fp32_precision", "fp16", "bf16"),
    )
    why = """
A value computed in fp16 or under TF32 carries a relative rounding error of about u = 2^-11 = 4.9e-4
(bf16: u = 2^-8 = 3.9e-3), and elements where large terms cancel carry an error of about u times the
typical magnitude of the values, whatever their own size. A check with rtol below 2u fails on a
correct result; a check with a tiny atol fails on the elements near zero: a correct fp16
patch-embedding convolution fails `assert_allclose(rtol=1e-3, atol=1e-5)` on about 19% of its
elements. The rule fires when the source shows the compared values computed in that precision:
a cast (`.half()`, `dtype=torch.float16`) or a low dtype named in their data flow (the expressions
compared, what is assigned to the names they read, the parameters' decorators), an autocast block
they are computed in, TF32 switched on in the test, its class's setUp or at module level. A dtype
named elsewhere in the file does not count. Functions that choose their tolerances from the dtype
(`assert_close` without rtol/atol) and integer values (indices, counts) are not judged.
"""
    example = """
def test_conv_fp16():
    out = conv.half()(x.half())
    torch.testing.assert_close(out.float(), ref, rtol=1e-5, atol=1e-5)
"""
    fix = f"""
Use a tolerance the precision can meet: rtol of about {RTOL_UNITS}u ({one_op(2.0 ** -11).rtol:.1e} for fp16 and TF32,
{one_op(2.0 ** -8).rtol:.1e} for bf16) and atol of about {HONEST.atol:.0f}u times the typical magnitude of the
compared values ({one_op(2.0 ** -11).atol:.1e} x RMS for fp16): one op's error, over {ONE_OP_NUMEL} elements,
with the margin preclint.testing.tolerance uses for a whole model (which it measures or predicts
for your model's outputs). Or compare in fp32 where the test is about the model's logic, not its
precision.
"""
    valid = (
        """
import torch

def test_fp32():
    torch.testing.assert_close(model(x), ref, rtol=1e-5, atol=1e-6)
""",
        """
import torch

def test_fp16():
    out = model.half()(x.half())
    torch.testing.assert_close(out.float(), ref, rtol=2e-3, atol=5e-3)
""",
        """
import torch

def test_fp16_forward():
    y = model.half()(x.half())

def test_fp32_forward():
    assert torch.allclose(model(x), ref, rtol=1e-6, atol=1e-6)
""",
        """
import torch

def test_fp16_defaults():
    with torch.autocast("cuda"):
        out = model(x)
    torch.testing.assert_close(out, ref.half())
""",
        """
import numpy as np

FLOATS = [np.half, np.single, np.double]  # used by other tests of the file

def test_quantile():
    q = np.quantile(y, 0.5)
    np.testing.assert_allclose(q, expected)
""",
        """
import torch

def test_fp16_argmax():
    logits = model.half()(x.half())
    assert torch.allclose(logits.argmax(-1), ref.argmax(-1))
""",
    )
    invalid = (
        """
import torch

def test_conv_fp16():
    conv = torch.nn.Conv2d(3, 8, 3).half()
    out = conv(torch.randn(1, 3, 16, 16).half())
    torch.testing.assert_close(out.float(), ref, rtol=1e-5, atol=1e-5)
""",
        """
import numpy as np
import torch

def test_patch_embed_fp16():
    with torch.autocast("cuda", dtype=torch.float16):
        out = patch_embed(x)
    np.testing.assert_allclose(out.float().cpu().numpy(), ref, rtol=1e-3, atol=1e-5)
""",
        """
import torch

torch.backends.cuda.matmul.allow_tf32 = True

def test_matmul():
    assert torch.allclose(a @ b, ref)
""",
        """
import pytest
import torch

@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matmul(dtype):
    out = (a.to(dtype) @ b.to(dtype)).float()
    torch.testing.assert_close(out, a @ b, rtol=1e-5, atol=1e-5)
""",
        """
import unittest

import torch

class TestBF16(unittest.TestCase):
    def setUp(self):
        self.model = model.to(torch.bfloat16)

    def test_forward(self):
        out = self.model(x)
        self.assertTrue(out.float().allclose(ref, rtol=1e-3, atol=1e-2))
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        index = source.index
        for site in index.calls:
            params = self._params(site, index)
            if params is None:
                continue
            rtol_pos, atol_pos, rtol_default, atol_default = params
            rtol_node = argument(site.node, "rtol", rtol_pos)
            atol_node = argument(site.node, "atol", atol_pos)
            if rtol_node is None and atol_node is None and rtol_default is None:
                continue  # dtype-aware defaults
            rtol = number(rtol_node, index.constants) if rtol_node is not None else rtol_default
            atol = number(atol_node, index.constants) if atol_node is not None else atol_default
            values = _compared(site)
            if any(_integer_valued(value, site, index) for value in values):
                continue  # integer tensors (indices, counts) compare exactly: no tolerance to judge
            evidence = source.evidence.reaching(site, values)
            if not evidence:
                continue
            # judge against the finest format shown: where a test shows two, it must meet the finer
            # one; autocast on a device the source does not name counts as fp16 (the finer default)
            known = [e.fmt for e in evidence if e.fmt is not None]
            fmt = min(known, key=lambda f: f.unit_roundoff) if known else FP16
            problem = self._problem(rtol, atol, fmt, rtol_node is None, atol_node is None)
            if problem is None:
                continue
            shown = min((e for e in evidence if e.fmt in (fmt, None)), key=lambda e: source.location(e.node))
            where = source.location(shown.node)
            name = fmt.name if known else "reduced precision"
            u = fmt.unit_roundoff
            meets = one_op(u)
            fix = (
                f"A tolerance {name} can meet: rtol={meets.rtol:.1e} ({RTOL_UNITS}u) and "
                f"atol of about {meets.atol:.1e} x the typical magnitude of the compared values "
                f"({HONEST.atol:.0f}u x RMS); {name} shown by `{shown.text}` at line {where.line}."
            )
            yield source.report(
                self, site.node, problem.format(fmt=name, u=u), fix,
                precisions=tuple(sorted({e.fmt.name for e in evidence if e.fmt is not None})),
            )

    @staticmethod
    def _params(site, index) -> Optional[Tuple]:
        qualified = index.qualify(site.dotted, site)
        if qualified in CHECKS:
            return CHECKS[qualified]
        if qualified is None and site.method in METHODS:
            return METHODS[site.method]  # a tensor's own method: ``out.allclose(ref)``
        if (site.dotted or "").rsplit(".", 1)[-1] in NAMES:
            return (None, None, None, None)
        return None

    @staticmethod
    def _problem(rtol, atol, fmt: Format, rtol_default: bool, atol_default: bool) -> Optional[str]:
        u = fmt.unit_roundoff
        rtol_text = f"rtol={rtol:g}" + (" (the default)" if rtol_default else "") if rtol is not None else ""
        atol_text = f"atol={atol:g}" + (" (the default)" if atol_default else "") if atol is not None else ""
        if rtol is not None and rtol < resolution(u):
            return (
                f"{rtol_text} is below what {{fmt}} can resolve: its unit roundoff is {{u:.1e}}, "
                f"so a correct {{fmt}} result fails this check."
            )
        if atol is not None and atol == 0:
            return (
                f"{atol_text} fails elements near zero: their {{fmt}} rounding error is about u times "
                f"the typical magnitude of the values, not u times their own size."
            )
        meets = one_op(u)
        if rtol is not None and atol is not None and rtol < meets.rtol and atol < u:
            return (
                f"{atol_text} covers {{fmt}} rounding only for values below about {atol / meets.atol:.1g} "
                f"in magnitude, and {rtol_text} is under {RTOL_UNITS}u: a correct {{fmt}} result fails on elements near zero."
            )
        return None
