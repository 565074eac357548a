"""Reading a call's arguments as written: by keyword, by position, or either."""
from __future__ import annotations

from typing import Optional, Sequence

import libcst as cst
from preclint.text.index import literal


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
        value = literal(node)
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


_SPACE_COMMA = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def _line_break(like: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    """A line break indented as ``like``, without its comment or blank lines."""
    return cst.ParenthesizedWhitespace(indent=like.indent, last_line=like.last_line)


def _argument_indent(call: cst.Call, closing: cst.ParenthesizedWhitespace) -> cst.ParenthesizedWhitespace:
    """The line break that separates the arguments of a call written one argument a line."""
    separators = [arg.comma.whitespace_after for arg in call.args[:-1] if isinstance(arg.comma, cst.Comma)]
    for whitespace in reversed(separators + [call.whitespace_before_args]):
        if isinstance(whitespace, cst.ParenthesizedWhitespace):
            return _line_break(whitespace)
    return cst.ParenthesizedWhitespace(indent=closing.indent, last_line=cst.SimpleWhitespace(closing.last_line.value + "    "))


def with_arguments(call: cst.Call, args: Sequence[cst.Arg], extra: Sequence[cst.Arg]) -> cst.Call:
    """``call`` with the arguments ``args`` (its own, perhaps rewritten) followed by ``extra``. Every
    comment stays where it was: a call written one argument a line gets the new arguments on lines
    of their own, after the comment that ended the last one; a trailing comma stays trailing."""
    args, extra = list(args), [arg.with_changes(comma=cst.MaybeSentinel.DEFAULT) for arg in extra]
    if not extra:
        return call.with_changes(args=args)
    if not args:
        return call.with_changes(args=[arg.with_changes(comma=_SPACE_COMMA) for arg in extra[:-1]] + extra[-1:])
    last = args[-1]
    had_comma = isinstance(last.comma, cst.Comma)
    closing = last.comma.whitespace_after if had_comma else last.whitespace_after_arg
    if isinstance(closing, cst.ParenthesizedWhitespace):
        separator = _argument_indent(call.with_changes(args=args), closing)
        before = last.comma.whitespace_before if had_comma else cst.SimpleWhitespace("")
        # the old closing whitespace (with its comment) now ends the last old argument's line
        args[-1] = last.with_changes(
            comma=cst.Comma(whitespace_before=before, whitespace_after=closing.with_changes(
                indent=separator.indent, last_line=separator.last_line)),
            whitespace_after_arg=last.whitespace_after_arg if had_comma else cst.SimpleWhitespace(""),
        )
        extra = [arg.with_changes(comma=cst.Comma(whitespace_after=separator)) for arg in extra[:-1]] + extra[-1:]
        end = _line_break(closing)
        if had_comma:
            extra[-1] = extra[-1].with_changes(comma=cst.Comma(whitespace_after=end))
        else:
            extra[-1] = extra[-1].with_changes(whitespace_after_arg=end)
        return call.with_changes(args=args + extra)
    # one line: ", " between arguments; the trailing comma and the space before ``)`` stay at the end
    args[-1] = last.with_changes(comma=_SPACE_COMMA, whitespace_after_arg=last.whitespace_after_arg if had_comma else cst.SimpleWhitespace(""))
    extra = [arg.with_changes(comma=_SPACE_COMMA) for arg in extra[:-1]] + extra[-1:]
    extra[-1] = extra[-1].with_changes(
        comma=last.comma if had_comma else cst.MaybeSentinel.DEFAULT,
        whitespace_after_arg=cst.SimpleWhitespace("") if had_comma else last.whitespace_after_arg,
    )
    return call.with_changes(args=args + extra)


def with_first_argument(call: cst.Call, first: cst.Arg, args: Optional[Sequence[cst.Arg]] = None) -> cst.Call:
    """``call`` with ``first`` put before its arguments (``args``, default its own), on a line of its
    own where the call is written one argument a line."""
    args = list(call.args if args is None else args)
    if not args:
        return call.with_changes(args=[first.with_changes(comma=cst.MaybeSentinel.DEFAULT)])
    opening = call.whitespace_before_args
    after = _line_break(opening) if isinstance(opening, cst.ParenthesizedWhitespace) else cst.SimpleWhitespace(" ")
    return call.with_changes(args=[first.with_changes(comma=cst.Comma(whitespace_after=after))] + args)
