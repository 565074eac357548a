"""One pass over a parsed file that collects what the source rules read: imports, calls, attribute
references and assignments, additions of constants, and module-level numeric constants, each with
where it runs (which function, which class, at import time or not).

Rules query this index instead of walking the tree themselves, so a file is walked once whatever
the number of rules. Names are resolved syntactically from the file's imports (as TorchFix does
through libcst's qualified names, but without building scopes): ``import torch as th`` makes
``th.cuda.amp.autocast`` resolve to ``torch.cuda.amp.autocast``. A name imported in one function
and rebound elsewhere is not tracked; the rules accept that imprecision.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple

import libcst as cst


@dataclass
class Site:
    node: cst.CSTNode
    scope: Optional[cst.FunctionDef]  # the outermost function the node is in; None at module or class level
    klass: Optional[cst.ClassDef]  # the innermost class the node is in
    import_time: bool  # runs when the module is imported: not in a function, not under the main guard
    main_guard: bool  # under ``if __name__ == "__main__":``


@dataclass
class CallSite(Site):
    dotted: Optional[str] = None  # "torch.cuda.amp.autocast" as written; None when func is not a dotted name
    method: Optional[str] = None  # "half" for ``x.half()``: the attribute called, whatever its receiver


@dataclass
class RefSite(Site):
    dotted: str = ""  # a maximal dotted name as written: "torch.backends.cudnn.allow_tf32", "autocast"
    is_call_func: bool = False  # the name is the function of a call


@dataclass
class AssignSite(Site):
    dotted: str = ""  # the dotted target as written: "torch.backends.cuda.matmul.allow_tf32"
    value: Optional[cst.BaseExpression] = None


@dataclass
class Index:
    aliases: Dict[str, str] = field(default_factory=dict)  # local name -> qualified name
    constants: Dict[str, float] = field(default_factory=dict)  # module-level NAME = number
    calls: List[CallSite] = field(default_factory=list)
    refs: List[RefSite] = field(default_factory=list)
    assigns: List[AssignSite] = field(default_factory=list)
    binops: List[Site] = field(default_factory=list)  # every BinaryOperation (a + b, a / b, ...)
    from_imports: Dict[str, cst.ImportFrom] = field(default_factory=dict)  # local name -> its import

    def qualify(self, dotted: Optional[str]) -> Optional[str]:
        """The qualified name of a dotted name as written, through the file's imports; ``torch`` counts
        as the torch module even when the import is not visible (snippets, star imports)."""
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        if head in self.aliases:
            base = self.aliases[head]
        elif head == "torch":
            base = "torch"
        else:
            return None
        return f"{base}.{rest}" if rest else base

    def references(self, qualified_names) -> Iterator[Tuple["RefSite", str, Optional["CallSite"]]]:
        """Each reference to one of ``qualified_names``: the site, its qualified name, and the call it
        is the function of (None for a bare reference such as an import or an alias)."""
        calls = {id(site.node.func): site for site in self.calls}
        for ref in self.refs:
            qualified = self.qualify(ref.dotted)
            if qualified in qualified_names:
                yield ref, qualified, (calls.get(id(ref.node)) if ref.is_call_func else None)

    def torch_alias(self) -> Optional[str]:
        """A module-level name bound to the torch module itself (``import torch [as th]``)."""
        for name, qualified in self.aliases.items():
            if qualified == "torch":
                return name
        return None


def dotted_name(node: cst.BaseExpression) -> Optional[str]:
    """``a.b.c`` for a chain of names, None for anything else (calls, subscripts)."""
    parts = []
    while isinstance(node, cst.Attribute):
        parts.append(node.attr.value)
        node = node.value
    if not isinstance(node, cst.Name):
        return None
    parts.append(node.value)
    return ".".join(reversed(parts))


def number(node: Optional[cst.BaseExpression], constants: Optional[Dict[str, float]] = None, depth: int = 0) -> Optional[float]:
    """The value of a numeric constant expression (``1e-3``, ``-2``, ``2 ** -10``, ``4 * 2.0 ** -11``,
    a module-level constant), or None. Expressions nested deeper than a literal needs are not evaluated."""
    if node is None or depth > 20:
        return None
    if isinstance(node, (cst.Integer, cst.Float)):
        try:
            return float(node.evaluated_value)
        except (ValueError, OverflowError):
            return None
    if isinstance(node, cst.Name):
        return (constants or {}).get(node.value)
    if isinstance(node, cst.UnaryOperation):
        value = number(node.expression, constants, depth + 1)
        if value is None:
            return None
        if isinstance(node.operator, cst.Minus):
            return -value
        if isinstance(node.operator, cst.Plus):
            return value
        return None
    if isinstance(node, cst.BinaryOperation):
        left, right = number(node.left, constants, depth + 1), number(node.right, constants, depth + 1)
        if left is None or right is None:
            return None
        op = node.operator
        try:
            if isinstance(op, cst.Add):
                return left + right
            if isinstance(op, cst.Subtract):
                return left - right
            if isinstance(op, cst.Multiply):
                return left * right
            if isinstance(op, cst.Divide):
                return left / right
            if isinstance(op, cst.Power):
                return float(left**right)
        except (ZeroDivisionError, OverflowError, TypeError):
            return None
    return None


def _is_main_guard(test: cst.BaseExpression) -> bool:
    if not isinstance(test, cst.Comparison) or len(test.comparisons) != 1:
        return False
    target = test.comparisons[0]
    if not isinstance(target.operator, cst.Equal):
        return False
    sides = (test.left, target.comparator)
    names = [s for s in sides if isinstance(s, cst.Name) and s.value == "__name__"]
    strings = [s for s in sides if isinstance(s, cst.SimpleString) and s.evaluated_value == "__main__"]
    return len(names) == 1 and len(strings) == 1


# Fields of a node that hold no code: whitespace, comments, punctuation. The walk skips them.
_SKIP_FIELDS = frozenset(
    """lpar rpar leading_lines lines_after_decorator header footer comma semicolon equal colon dot star
    whitespace_before whitespace_after whitespace_after_at whitespace_before_colon whitespace_after_colon
    whitespace_before_params whitespace_after_def whitespace_after_class whitespace_before_args
    whitespace_after_arg whitespace_after_star whitespace_after_star_star whitespace_after_param
    whitespace_after_func whitespace_before_from whitespace_after_from whitespace_after_import
    whitespace_after_as whitespace_before_as whitespace_before_indent whitespace_after_in whitespace_before_in
    whitespace_after_for whitespace_before_for whitespace_after_if whitespace_before_if whitespace_after_else
    whitespace_before_else whitespace_after_lambda whitespace_after_await whitespace_after_return
    whitespace_after_assert whitespace_after_del whitespace_after_global whitespace_after_nonlocal
    whitespace_after_raise whitespace_after_with whitespace_after_async whitespace_after_yield
    whitespace_after_walrus whitespace_before_walrus trailing_whitespace operator newline indent
    first_line_newline default_newline default_indent encoding""".split()
)
_CHILD_FIELDS: Dict[type, tuple] = {}


def _child_fields(kind: type) -> tuple:
    fields = _CHILD_FIELDS.get(kind)
    if fields is None:
        fields = tuple(f.name for f in dataclasses.fields(kind) if f.name not in _SKIP_FIELDS)
        _CHILD_FIELDS[kind] = fields
    return fields


def walk(root: cst.CSTNode, visitor) -> None:
    """Visit ``root`` and the code below it, in source order, calling ``visitor.visit_<Type>(node)``
    (a False return skips the node's children) and ``visitor.leave_<Type>(node)``.

    libcst's own visitors rebuild every node on the way up, which makes a walk several times slower
    than parsing; this one only reads the dataclass fields that hold code, iteratively, so deep
    expressions cannot exhaust the interpreter's recursion limit either.
    """
    stack = [(root, False)]
    visits: Dict[type, tuple] = {}
    while stack:
        node, leaving = stack.pop()
        kind = type(node)
        methods = visits.get(kind)
        if methods is None:
            methods = (getattr(visitor, "visit_" + kind.__name__, None), getattr(visitor, "leave_" + kind.__name__, None))
            visits[kind] = methods
        if leaving:
            methods[1](node)
            continue
        if methods[0] is not None and methods[0](node) is False:
            if methods[1] is not None:
                methods[1](node)
            continue
        if methods[1] is not None:
            stack.append((node, True))
        children = []
        for name in _child_fields(kind):
            value = getattr(node, name)
            if isinstance(value, cst.CSTNode):
                children.append(value)
            elif isinstance(value, (tuple, list)):
                children.extend(v for v in value if isinstance(v, cst.CSTNode))
        stack.extend((child, False) for child in reversed(children))


class _Collector:
    def __init__(self, index: Index):
        self.index = index
        self.functions: List[cst.FunctionDef] = []
        self.classes: List[cst.ClassDef] = []
        self.lambdas = 0
        self.guard_blocks: Set[int] = set()
        self.guard_depth = 0
        self.call_funcs: Set[int] = set()

    def _site(self, cls, node, **kw):
        site = cls(
            node=node,
            scope=self.functions[0] if self.functions else None,
            klass=self.classes[-1] if self.classes else None,
            import_time=not self.functions and not self.lambdas and not self.guard_depth,
            main_guard=self.guard_depth > 0,
            **kw,
        )
        return site

    # where code runs
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        # decorators and defaults run at definition time, in the enclosing scope: visit them first
        for decorator in node.decorators:
            walk(decorator, self)
        walk(node.params, self)
        self.functions.append(node)
        walk(node.body, self)
        self.functions.pop()
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.append(node)

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self.classes.pop()

    def visit_Lambda(self, node: cst.Lambda) -> None:
        self.lambdas += 1

    def leave_Lambda(self, node: cst.Lambda) -> None:
        self.lambdas -= 1

    def visit_If(self, node: cst.If) -> None:
        if not self.functions and not self.classes and _is_main_guard(node.test):
            self.guard_blocks.add(id(node.body))

    def visit_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if id(node) in self.guard_blocks:
            self.guard_depth += 1

    def leave_IndentedBlock(self, node: cst.IndentedBlock) -> None:
        if id(node) in self.guard_blocks:
            self.guard_depth -= 1

    # names
    def visit_Import(self, node: cst.Import) -> bool:
        self._imported(node)
        return False  # the names in an import statement bind; they are not uses

    def _imported(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name)
            if full is None:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.index.aliases[alias.asname.name.value] = full
            else:
                head = full.split(".")[0]
                self.index.aliases[head] = head

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        self._imported_from(node)
        return False

    def _imported_from(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None or isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module)
        if module is None:
            return
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            if name is None:
                continue
            local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            self.index.aliases[local] = f"{module}.{name}"
            self.index.from_imports[local] = node

    # what rules read
    def visit_Call(self, node: cst.Call) -> None:
        func = node.func
        method = func.attr.value if isinstance(func, cst.Attribute) else None
        self.call_funcs.add(id(func))
        self.index.calls.append(self._site(CallSite, node, dotted=dotted_name(func), method=method))

    def visit_Attribute(self, node: cst.Attribute) -> Optional[bool]:
        dotted = dotted_name(node)
        if dotted is None:
            return None
        self.index.refs.append(self._site(RefSite, node, dotted=dotted, is_call_func=id(node) in self.call_funcs))
        return False  # a pure chain: its parts are not names of their own

    def visit_Name(self, node: cst.Name) -> None:
        if node.value in self.index.aliases:
            self.index.refs.append(
                self._site(RefSite, node, dotted=node.value, is_call_func=id(node) in self.call_funcs)
            )

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._assigned(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None:
            self._assigned(node.target, node.value)

    def _assigned(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Attribute):
            dotted = dotted_name(target)
            if dotted is not None:
                self.index.assigns.append(self._site(AssignSite, target, dotted=dotted, value=value))
        elif isinstance(target, cst.Name) and not self.functions and not self.classes:
            value_number = number(value, self.index.constants)
            if value_number is not None:
                self.index.constants[target.value] = value_number
            else:
                self.index.constants.pop(target.value, None)

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self.index.binops.append(self._site(Site, node))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> Optional[bool]:
        # the target of ``a.b = v`` is a store, recorded by visit_Assign; its value is still visited
        return False if isinstance(node.target, (cst.Attribute, cst.Name)) else None


def build_index(module: cst.Module) -> Index:
    index = Index()
    walk(module, _Collector(index))
    return index
