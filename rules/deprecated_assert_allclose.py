"""PCL503 deprecated-assert-allclose: torch.testing.assert_allclose, replaced by assert_close."""
from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import libcst as cst

from preclint.findings import Finding
from preclint.rulebase import SourceRule
from preclint.source.args import has_star, keyword_arg

DEPRECATED = ("torch.testing.assert_allclose", "torch.testing._comparison.assert_allclose")
# assert_allclose(actual, expected, rtol=None, atol=None, equal_nan=True, msg=""): assert_close takes
# everything after ``expected`` by keyword only
PARAMS = ("actual", "expected", "rtol", "atol", "equal_nan", "msg")
_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
# torch/testing/_comparison.py: the tolerances assert_allclose picks when given neither
OLD_DEFAULTS = "float16: rtol=1e-3, atol=1e-3; float32: rtol=1e-4, atol=1e-5; float64: rtol=1e-5, atol=1e-8"


class DeprecatedAssertAllclose(SourceRule):
    code = "PCL503"
    name = "deprecated-assert-allclose"
    summary = "`torch.testing.assert_allclose` is deprecated; `torch.testing.assert_close` replaces it."
    severity = "warning"
    fixable = True
    triggers = (("torch",), ("assert_allclose",))
    why = """
`torch.testing.assert_allclose` has been deprecated since torch 1.12 (FutureWarning on every call) and
is slated for removal. It is not a plain alias of `assert_close`: it calls `assert_close` with
`equal_nan=True` and `check_dtype=False`, and when given neither rtol nor atol it picks its own
dtype-based tolerances (float16: 1e-3/1e-3, float32: 1e-4/1e-5, float64: 1e-5/1e-8), looser than
`assert_close`'s (float32: 1.3e-6/1e-5). A bare rename would silently tighten a float32 test by ~77x
in rtol and make it compare dtypes and NaNs differently. (TorchFix's TOR101 flags it without a fix.)
"""
    example = """
torch.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-5)
"""
    fix = """
Use `torch.testing.assert_close`. `--fix` rewrites calls that pass both rtol and atol, keeping the old
semantics explicit: `torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-5, equal_nan=True,
check_dtype=False)` (positional tolerances become keywords; an explicit `equal_nan` is kept). Calls
without tolerances are reported without a fix, because the tolerances assert_allclose used depend on
the dtype at run time: pass the ones for your dtype (float32: `rtol=1e-4, atol=1e-5`). Calls with only
one of the two already raise (assert_close needs both or neither). assert_allclose also turned lists and
numbers into tensors; assert_close compares them as they are and fails loudly on a type mismatch.
"""
    valid = (
        """
import torch

torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-5)
""",
        """
import numpy as np

np.testing.assert_allclose(out, ref, rtol=1e-3)
""",
    )
    invalid = (
        """
import torch

torch.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-5)
""",
        """
from torch.testing import assert_allclose

def test_forward():
    assert_allclose(model(x), expected)
""",
        """
import torch

torch.testing.assert_allclose(out, ref, 1e-3, 1e-5, False)
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        index = source.index
        for ref, _qualified, call in index.references(DEPRECATED):
            message = "`torch.testing.assert_allclose` is deprecated; use `torch.testing.assert_close`."
            if call is None:
                yield source.report(self, ref.node, message, "Replace it with `torch.testing.assert_close` by hand.")
                continue
            new_call, why_not = self._rewrite(call.node, ref, index)
            if new_call is None:
                yield source.report(self, call.node, message, f"Use `torch.testing.assert_close` ({why_not}).")
                continue
            new_node, add, unused = new_call
            yield source.report(
                self, call.node, message,
                "Use `torch.testing.assert_close` with equal_nan=True and check_dtype=False, which keeps "
                "what assert_allclose did (fixable with --fix).",
                replacement=new_node, add_imports=add, unused_imports=unused,
            )

    def _rewrite(self, call: cst.Call, ref, index) -> Tuple[Optional[tuple], str]:
        if has_star(call):
            return None, "the call passes *args or **kwargs; name the tolerances explicitly"
        args: List[cst.Arg] = []
        given = set()
        position = 0
        for arg in call.args:
            if arg.keyword is None:
                if position >= len(PARAMS):
                    return None, "the call passes more arguments than assert_allclose takes"
                name = PARAMS[position]
                position += 1
                if position > 2:  # assert_close takes only actual and expected by position
                    arg = keyword_arg(name, arg.value, arg.comma)
            else:
                name = arg.keyword.value
            given.add(name)
            if name == "msg" and isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "":
                continue  # assert_allclose turned "" into None (the default message); assert_close would print ""
            args.append(arg)
        if "rtol" not in given and "atol" not in given:
            return None, (
                f"pass the tolerances assert_allclose chose for your dtype, {OLD_DEFAULTS}; "
                "not fixed automatically, since they depend on the dtype at run time"
            )
        if ("rtol" in given) != ("atol" in given):
            return None, "it passes only one of rtol and atol, which already raises: pass both"
        extra = []
        if "equal_nan" not in given:
            extra.append(keyword_arg("equal_nan", cst.Name("True")))
        extra.append(keyword_arg("check_dtype", cst.Name("False")))
        if args:
            args[-1] = args[-1].with_changes(comma=_COMMA)
        for i, arg in enumerate(extra[:-1]):
            extra[i] = arg.with_changes(comma=_COMMA)
        root = ref.dotted.split(".")[0]
        add: Tuple[str, ...] = ()
        unused: Tuple[Tuple[str, str], ...] = ()
        if index.aliases.get(root) == "torch" or (root == "torch" and root not in index.aliases):
            func = cst.parse_expression(f"{root}.testing.assert_close")
        elif index.aliases.get(root) == "torch.testing":
            func = cst.parse_expression(f"{root}.assert_close")
        else:
            torch_name = index.torch_alias()
            if torch_name is None:
                torch_name, add = "torch", ("torch",)
            func = cst.parse_expression(f"{torch_name}.testing.assert_close")
            if root in index.from_imports:
                module, _, name = index.aliases[root].rpartition(".")
                unused = ((module, name),)
        return (call.with_changes(func=func, args=args + extra), add, unused), ""
