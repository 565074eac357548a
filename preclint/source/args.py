"""Reading a call's arguments as written: by keyword, by position, or either."""
from __future__ import annotations

from typing import Optional

import libcst as cst


def keyword(call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == name:
            return arg.value
    return None


def positional(call: cst.Call, i: int) -> Optional[cst.BaseExpression]:
    values = [arg.value for arg in call.args if arg.keyword is None and not arg.star]
    return values[i] if 0 <= i < len(values) else None


def argument(call: cst.Call, name: str, position: Optional[int]) -> Optional[cst.BaseExpression]:
    """The argument bound to parameter ``name`` (at ``position`` when passed positionally)."""
    value = keyword(call, name)
    if value is None and position is not None:
        value = positional(call, position)
    return value


def has_star(call: cst.Call) -> bool:
    """``*args`` or ``**kwargs``: what they bind is unknown to a reader of the source."""
    return any(arg.star for arg in call.args)


def string(node: Optional[cst.BaseExpression]) -> Optional[str]:
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return value if isinstance(value, str) else None
    return None


def is_name(node: Optional[cst.BaseExpression], value: str) -> bool:
    return isinstance(node, cst.Name) and node.value == value


def code(node: cst.CSTNode) -> str:
    """The source text of a node, as written."""
    return cst.Module(body=[]).code_for_node(node)


def keyword_arg(name: str, value: cst.BaseExpression, comma=cst.MaybeSentinel.DEFAULT) -> cst.Arg:
    """``name=value`` written the way PEP 8 writes keyword arguments (no spaces around ``=``)."""
    no_space = cst.SimpleWhitespace("")
    return cst.Arg(
        value=value,
        keyword=cst.Name(name),
        equal=cst.AssignEqual(whitespace_before=no_space, whitespace_after=no_space),
        comma=comma,
    )
