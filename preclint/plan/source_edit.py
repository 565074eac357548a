"""The plan as an edit of the user's own source: each kept call, where the user's file makes it,
wrapped in ``torch.autocast(..., enabled=False)`` with its tensor operand cast to float32. Printed
as a unified diff; the file itself is never written.

Only autocast modes: a cast model (``-full``) holds float16 parameters, which no edit at the call
can keep in float32; there ``apply_policy`` does it.
"""
from __future__ import annotations

import difflib
import os
from typing import Dict, List, Optional, Set

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider
from preclint.plan.units import Unit, unit_nodes


def source_diff(plan, graph, source_path: Optional[str]) -> Optional[str]:
    if not plan.keep or plan.precision.endswith("-full") or not source_path:
        return None

    target = os.path.realpath(source_path)
    calls: Dict[int, Set[str]] = {}  # line -> names of the callees kept there
    for k in plan.keep:
        name = k.op if k.op is not None else (k.module.rpartition(".")[2] if k.module else None)
        if name is None:
            continue
        for node_name in unit_nodes(graph, Unit(k.module, k.op)):
            location = graph[node_name].location
            if location is None or location.library:
                continue
            if os.path.realpath(location.path) == target:
                calls.setdefault(location.line, set()).add(name)
    if not calls:
        return None
    try:
        with open(source_path, encoding="utf-8") as f:
            text = f.read()
        module = cst.parse_module(text)
    except (OSError, UnicodeDecodeError, cst.ParserSyntaxError):
        return None
    wrapper = MetadataWrapper(module)
    changed = wrapper.visit(_KeepCalls(calls))
    if changed.code == text:
        return None
    shown = os.path.relpath(source_path) if not os.path.relpath(source_path).startswith("..") else source_path
    return "".join(difflib.unified_diff(text.splitlines(True), changed.code.splitlines(True),
                                        f"a/{shown}", f"b/{shown}"))


def _callee_name(func: cst.BaseExpression) -> Optional[str]:
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return None


def _float(expr: cst.BaseExpression) -> cst.BaseExpression:
    return cst.Call(cst.Attribute(expr, cst.Name("float")))


_OPERATORS = {cst.Multiply: "mul", cst.Add: "add", cst.Subtract: "sub", cst.Divide: "div", cst.Power: "pow",
              cst.MatrixMultiply: "matmul"}


class _KeepCalls(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, calls: Dict[int, Set[str]]) -> None:
        super().__init__()
        self.calls = calls
        self.lines: List[int] = []

    def _line(self, node) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        names = self.calls.get(self._line(original))
        if not names or _callee_name(original.func) not in names or not updated.args:
            return updated
        first = updated.args[0]
        if first.star or first.keyword is not None:
            return updated
        return updated.with_changes(args=[first.with_changes(value=_float(first.value))] + list(updated.args[1:]))

    def leave_BinaryOperation(self, original: cst.BinaryOperation, updated: cst.BinaryOperation) -> cst.BaseExpression:
        names = self.calls.get(self._line(original))
        if not names or _OPERATORS.get(type(original.operator)) not in names:
            return updated
        return updated.with_changes(left=_float(updated.left), right=_float(updated.right))

    def leave_SimpleStatementLine(self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine):
        if original.deep_equals(updated) or self._line(original) not in self.calls:
            return updated
        autocast = cst.parse_expression('torch.autocast("cuda", enabled=False)')
        return cst.With(items=[cst.WithItem(autocast)], body=cst.IndentedBlock(body=[updated.with_changes(leading_lines=())]),
                        leading_lines=updated.leading_lines)
