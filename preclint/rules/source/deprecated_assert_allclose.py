"""PCL503 deprecated-assert-allclose: torch.testing.assert_allclose, replaced by assert_close."""
from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import libcst as cst

from preclint.core.findings import Finding
from preclint.rules.base import SourceRule
from preclint.text.args import has_star, keyword_arg, with_arguments
from preclint.text.index import dotted_name, number

DEPRECATED = ("torch.testing.assert_allclose", "torch.testing._comparison.assert_allclose")
# assert_allclose(actual, expected, rtol=None, atol=None, equal_nan=True, msg=""): assert_close takes
# everything after ``expected`` by keyword only
PARAMS = ("actual", "expected", "rtol", "atol", "equal_nan", "msg")
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
Use `torch.testing.assert_close`, keeping the old semantics explicit: `torch.testing.assert_close(out,
ref, rtol=1e-3, atol=1e-5, equal_nan=True, check_dtype=False)` (positional tolerances become keywords;
an explicit `equal_nan` is kept, a non-literal `msg` becomes `msg or None`). The rewrite keeps what the
test does only when rtol and atol are numbers written out (a variable may be None, and then
assert_allclose chose dtype-based tolerances where assert_close chooses stricter ones) and both values
are tensors (assert_allclose turned numbers and lists into tensors; assert_close raises TypeError on a
tensor compared with a number). `--fix` applies it where the source shows both; otherwise it is an
unsafe fix, applied only with `--fix --unsafe-fixes`, to review. Calls without tolerances get no fix:
the tolerances assert_allclose used depend on the dtype at run time; pass the ones for your dtype
(float32: `rtol=1e-4, atol=1e-5`). Calls with only one of the two already raise.
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
import torch

torch.testing.assert_allclose(torch.ones(3).float(), torch.full((3,), 1.0), rtol=0, atol=1e-6)
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
            rewrite, safe, why_not = self._rewrite(call.node, ref, index)
            if rewrite is None:
                yield source.report(self, call.node, message, f"Use `torch.testing.assert_close` ({why_not}).")
                continue
            new_node, add, unused = rewrite
            how = "fixable with --fix" if safe else (
                f"an unsafe fix, applied by --fix --unsafe-fixes: {why_not}"
            )
            yield source.report(
                self, call.node, message,
                f"Use `torch.testing.assert_close` with equal_nan=True and check_dtype=False, which keeps "
                f"what assert_allclose did ({how}).",
                replacement=new_node, add_imports=add, unused_imports=unused, safe=safe,
            )

    def _rewrite(self, call: cst.Call, ref, index) -> Tuple[Optional[tuple], bool, str]:
        """(replacement, imports to add, imports that may become unused), whether it provably keeps
        the behaviour, and why not (or why there is no rewrite)."""
        if has_star(call):
            return None, False, "the call passes *args or **kwargs; name the tolerances explicitly"
        args: List[cst.Arg] = []
        given = {}
        position = 0
        for arg in call.args:
            if arg.keyword is None:
                if position >= len(PARAMS):
                    return None, False, "the call passes more arguments than assert_allclose takes"
                name = PARAMS[position]
                position += 1
                if position > 2:  # assert_close takes only actual and expected by position
                    arg = keyword_arg(name, arg.value, arg.comma)
            else:
                name = arg.keyword.value
            given[name] = arg.value
            if name == "msg":
                if isinstance(arg.value, cst.SimpleString) and arg.value.evaluated_value == "":
                    continue  # assert_allclose turned "" into None (the default message)
                if not isinstance(arg.value, (cst.SimpleString, cst.ConcatenatedString)):
                    arg = arg.with_changes(value=_or_none(arg.value))  # assert_allclose passed ``msg or None``
            args.append(arg)
        if "rtol" not in given and "atol" not in given:
            return None, False, (
                f"pass the tolerances assert_allclose chose for your dtype, {OLD_DEFAULTS}; "
                "not fixed automatically, since they depend on the dtype at run time"
            )
        if ("rtol" in given) != ("atol" in given):
            return None, False, "it passes only one of rtol and atol, which already raises: pass both"
        func, add, unused = self._function(ref, index)
        if func is None:
            return None, False, "`torch` names something else here; write the call by hand"
        extra = []
        if "equal_nan" not in given:
            extra.append(keyword_arg("equal_nan", cst.Name("True")))
        extra.append(keyword_arg("check_dtype", cst.Name("False")))
        new_call = with_arguments(call.with_changes(func=func), args, extra)
        reasons = []
        if not all(_literal_number(given[name]) for name in ("rtol", "atol")):
            reasons.append("rtol and atol must not be None (assert_allclose then chose its own, assert_close its stricter ones)")
        if not all(_tensor(given.get(name), ref, index) for name in ("actual", "expected")):
            reasons.append("both values must be tensors (assert_allclose turned numbers and lists into tensors, "
                           "assert_close raises on them)")
        return (new_call, add, unused), not reasons, "; ".join(reasons)

    @staticmethod
    def _function(ref, index) -> Tuple[Optional[cst.BaseExpression], Tuple[str, ...], Tuple[Tuple[str, str], ...]]:
        """``torch.testing.assert_close`` as the call site can name it."""
        root = ref.dotted.split(".")[0]
        bound = index.qualify(root, ref)
        if bound == "torch":
            return cst.parse_expression(f"{root}.testing.assert_close"), (), ()
        if bound == "torch.testing":
            return cst.parse_expression(f"{root}.assert_close"), (), ()
        torch_name = index.torch_name(ref)
        add: Tuple[str, ...] = ()
        if torch_name is None:
            if index.qualify("torch", ref) != "torch":
                return None, (), ()
            torch_name, add = "torch", ("torch",)
        unused: Tuple[Tuple[str, str], ...] = ()
        if root in index.from_imports:
            module, _, name = index.aliases[root].rpartition(".")
            unused = ((module, name),)
        return cst.parse_expression(f"{torch_name}.testing.assert_close"), add, unused


# functions of torch that return a tensor whatever their arguments: a value built by one is a tensor
TENSOR_FUNCTIONS = frozenset(
    """tensor as_tensor from_numpy zeros ones full empty rand randn randint arange linspace logspace eye
    zeros_like ones_like full_like empty_like rand_like randn_like randint_like stack cat concat""".split()
)


def _literal_number(node: Optional[cst.BaseExpression]) -> bool:
    """A number written out (``1e-3``, ``2 ** -10``): never None, whatever runs before."""
    return node is not None and number(node) is not None


def _tensor(node: Optional[cst.BaseExpression], at, index) -> bool:
    """Whether ``node`` is a tensor whatever the program does: a tensor built by a torch factory
    (``torch.randn(3)``), perhaps converted (``.float()``, ``.to(...)``)."""
    while isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value in (
        "float", "double", "half", "bfloat16", "to", "cpu", "cuda", "detach", "clone", "contiguous"
    ):
        if index.qualify(dotted_name(node.func), at) is not None:
            break  # torch.float(...) and the like: not a method of a tensor
        node = node.func.value
    if not isinstance(node, cst.Call):
        return False
    qualified = index.qualify(dotted_name(node.func), at) or ""
    return qualified.startswith("torch.") and qualified[len("torch."):] in TENSOR_FUNCTIONS


def _or_none(value: cst.BaseExpression) -> cst.BaseExpression:
    """``value or None``, parenthesised where the expression needs it."""
    simple = (cst.Name, cst.Attribute, cst.Call, cst.Subscript, cst.FormattedString)
    left = value if isinstance(value, simple) else value.with_changes(
        lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    return cst.BooleanOperation(left=left, operator=cst.Or(), right=cst.Name("None"))
