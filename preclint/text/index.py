"""One pass over a parsed file that collects what the source rules read: imports, calls, attribute
references and assignments, additions of constants, and module-level numeric constants, each with
where it runs (which function, which class, at import time or not).

Rules query this index instead of walking the tree themselves, so a file is walked once whatever
the number of rules. Names are resolved through the file's imports and Python's scoping rules (as
TorchFix does through libcst's qualified names, with a lighter scope model built in the same walk):
``import torch as th`` makes ``th.cuda.amp.autocast`` resolve to ``torch.cuda.amp.autocast``, and a
name that a function binds otherwise (a parameter, an assignment, a loop variable: ``def f(torch):``)
resolves to nothing there. Within a scope an import wins over other bindings of the same name
(``try: import torch`` / ``except ImportError: torch = None``). Bindings are not ordered by flow.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Optional, Set, Tuple, Union

import libcst as cst


class Scope:
    """A namespace of the file as Python's name resolution sees it: the module, a class body, a
    function, a lambda or a comprehension. ``imports``: names bound by imports (-> qualified name);
    ``bound``: names bound any other way; ``declared``: ``global``/``nonlocal`` names."""

    __slots__ = ("kind", "parent", "imports", "bound", "declared")

    def __init__(self, kind: str, parent: Optional["Scope"] = None):
        self.kind = kind
        self.parent = parent
        self.imports: Dict[str, str] = {}
        self.bound: Set[str] = set()
        self.declared: Set[str] = set()

    def resolve(self, name: str) -> Optional[str]:
        """The qualified name ``name`` refers to here when an import binds it; None when something
        else does (or nothing, except ``torch``, which counts as the module in snippets)."""
        scope: Optional[Scope] = self
        past_function = False  # class bodies do not enclose the functions defined in them
        while scope is not None:
            if not (scope.kind == "class" and past_function) and name not in scope.declared:
                if name in scope.imports:
                    return scope.imports[name]
                if name in scope.bound:
                    return None
            past_function = past_function or scope.kind in ("function", "lambda", "comprehension")
            scope = scope.parent
        return "torch" if name == "torch" else None


@dataclass
class Site:
    node: cst.CSTNode
    scope: Optional[cst.FunctionDef]  # the outermost function the node is in; None at module or class level
    klass: Optional[cst.ClassDef]  # the innermost class the node is in
    import_time: bool  # runs when the module is imported: not in a function, not under the main guard
    main_guard: bool  # under ``if __name__ == "__main__":``
    names: Optional[Scope] = None  # the innermost namespace, for resolving names at the site


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
    dotted: str = ""  # the dotted target as written: "torch.backends.cuda.matmul.allow_tf32", "out"
    value: Optional[cst.BaseExpression] = None  # what flows into it (for ``for x in xs``: xs)


@dataclass
class Index:
    aliases: Dict[str, str] = field(default_factory=dict)  # module-level import: local name -> qualified name
    constants: Dict[str, float] = field(default_factory=dict)  # module-level NAME = number
    calls: List[CallSite] = field(default_factory=list)
    refs: List[RefSite] = field(default_factory=list)
    assigns: List[AssignSite] = field(default_factory=list)
    binops: List[Site] = field(default_factory=list)  # every BinaryOperation (a + b, a / b, ...)
    from_imports: Dict[str, cst.ImportFrom] = field(default_factory=dict)  # local name -> its import
    module_scope: Scope = field(default_factory=lambda: Scope("module"))
    # ids of expressions compared (``a is b``, ``a in (b, c)``) or listed in a collection literal (a
    # table of functions): a bare reference there names an object, it does not use it
    held_as_data: Set[int] = field(default_factory=set)
    with_statements: Dict[int, cst.With] = field(default_factory=dict)  # id(context expression) -> its with
    # (dotted target, id of the outermost function or None) -> the assignments with a value there, in
    # file order; built on first use, so that a rule asking per check costs its answer, not the file
    _assigned: Optional[Dict[Tuple[str, int], List["AssignSite"]]] = field(default=None, repr=False)

    def assigned_in(self, dotted: str, scope: Optional[cst.FunctionDef]) -> List["AssignSite"]:
        """The assignments of a value to ``dotted`` whose site's outermost function is ``scope``
        (None: module or class level), in file order."""
        if self._assigned is None:
            self._assigned = {}
            for assign in self.assigns:
                if assign.value is not None:
                    self._assigned.setdefault((assign.dotted, id(assign.scope)), []).append(assign)
        return self._assigned.get((dotted, id(scope)), [])

    def qualify(self, dotted: Optional[str], at: Optional[Site] = None) -> Optional[str]:
        """The qualified name of a dotted name as written at ``at`` (default: module level), through
        the imports in scope there; ``torch`` counts as the torch module when nothing binds it
        (snippets, star imports), and as nothing where a local name shadows it."""
        if not dotted:
            return None
        head, _, rest = dotted.partition(".")
        scope = at.names if at is not None and at.names is not None else self.module_scope
        base = scope.resolve(head)
        if base is None:
            return None
        return f"{base}.{rest}" if rest else base

    def references(self, qualified_names) -> Iterator[Tuple["RefSite", str, Optional["CallSite"]]]:
        """Each reference to one of ``qualified_names``: the site, its qualified name, and the call it
        is the function of (None for a bare reference such as an import or an alias)."""
        calls = {id(site.node.func): site for site in self.calls}
        for ref in self.refs:
            qualified = self.qualify(ref.dotted, ref)
            if qualified in qualified_names:
                yield ref, qualified, (calls.get(id(ref.node)) if ref.is_call_func else None)

    def torch_name(self, at: Site) -> Optional[str]:
        """A name that refers to the torch module at ``at`` (``torch``, or ``th`` after ``import torch
        as th``), for a fix to write; None when the only candidates are shadowed there."""
        candidates = ["torch"] + [name for name, qualified in self.aliases.items() if qualified == "torch"]
        for name in dict.fromkeys(candidates):
            if self.qualify(name, at) == "torch" and (name == "torch" or name in self.aliases):
                if name == "torch" and "torch" not in self.aliases and self.aliases:
                    continue  # ``torch`` unbound in a file that imports other things: not importable as is
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


def literal(node: Union[cst.Integer, cst.Float, cst.Imaginary, cst.SimpleString]) -> object:
    """A literal's value, or None where Python cannot evaluate it although libcst parses it (an
    integer of more than 4,300 digits, an unknown ``\\N{...}`` name in a string)."""
    try:
        return node.evaluated_value
    except (SyntaxError, ValueError, OverflowError, MemoryError):
        return None


def number(node: Optional[cst.BaseExpression], constants: Optional[Dict[str, float]] = None, depth: int = 0) -> Optional[float]:
    """The value of a numeric constant expression (``1e-3``, ``-2``, ``2 ** -10``, ``4 * 2.0 ** -11``,
    a module-level constant), or None. Expressions nested deeper than a literal needs are not evaluated."""
    if node is None or depth > 20:
        return None
    if isinstance(node, (cst.Integer, cst.Float)):
        value = literal(node)
        try:
            return None if value is None else float(value)
        except OverflowError:
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
    strings = [s for s in sides if isinstance(s, cst.SimpleString) and literal(s) == "__main__"]
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


def children(node: cst.CSTNode) -> List[cst.CSTNode]:
    """The code right below ``node`` (no whitespace nodes)."""
    found: List[cst.CSTNode] = []
    for name in _child_fields(type(node)):
        value = getattr(node, name)
        if isinstance(value, cst.CSTNode):
            found.append(value)
        elif isinstance(value, (tuple, list)):
            found.extend(v for v in value if isinstance(v, cst.CSTNode))
    return found


def descendants(root: cst.CSTNode) -> Iterator[cst.CSTNode]:
    """``root`` and the code below it (no whitespace nodes), iteratively."""
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(children(node))


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
        stack.extend((child, False) for child in reversed(children(node)))


def bound_names(target: cst.CSTNode) -> Iterator[str]:
    """The names an assignment target binds: ``a``, ``a, (b, *c)``; not ``a.b`` or ``a[0]``."""
    stack = [target]
    while stack:
        node = stack.pop()
        if isinstance(node, cst.Name):
            yield node.value
        elif isinstance(node, (cst.Tuple, cst.List)):
            stack.extend(element.value for element in node.elements)
        elif isinstance(node, cst.StarredElement):
            stack.append(node.value)


class _Collector:
    def __init__(self, index: Index):
        self.index = index
        self.functions: List[cst.FunctionDef] = []
        self.classes: List[cst.ClassDef] = []
        self.lambdas = 0
        self.guard_blocks: Set[int] = set()
        self.guard_depth = 0
        self.call_funcs: Set[int] = set()
        self.names = index.module_scope
        self.imported: Set[str] = {"torch"}  # names some import binds, anywhere: their uses are references

    def _site(self, cls, node, **kw):
        site = cls(
            node=node,
            scope=self.functions[0] if self.functions else None,
            klass=self.classes[-1] if self.classes else None,
            import_time=not self.functions and not self.lambdas and not self.guard_depth,
            main_guard=self.guard_depth > 0,
            names=self.names,
            **kw,
        )
        return site

    def _bind(self, target: cst.CSTNode, scope: Optional[Scope] = None) -> None:
        (scope or self.names).bound.update(bound_names(target))

    def _enter(self, kind: str) -> None:
        self.names = Scope(kind, self.names)

    def _exit(self) -> None:
        self.names = self.names.parent

    # where code runs, and the namespaces names live in
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        # decorators, defaults and annotations run at definition time, in the enclosing scope
        self.names.bound.add(node.name.value)
        for decorator in node.decorators:
            walk(decorator, self)
        walk(node.params, self)
        if node.returns is not None:
            walk(node.returns, self)
        self.functions.append(node)
        self._enter("function")
        self._bind_params(node.params)
        walk(node.body, self)
        self._exit()
        self.functions.pop()
        return False

    def _bind_params(self, params: cst.Parameters) -> None:
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            self.names.bound.add(param.name.value)
        for star in (params.star_arg, params.star_kwarg):
            if isinstance(star, cst.Param):
                self.names.bound.add(star.name.value)

    def visit_Param(self, node: cst.Param) -> Optional[bool]:
        # the name is bound (by _bind_params); its default and annotation are code to visit
        if node.default is not None:
            walk(node.default, self)
        if node.annotation is not None:
            walk(node.annotation, self)
        return False

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.names.bound.add(node.name.value)
        self.classes.append(node)
        self._enter("class")

    def leave_ClassDef(self, node: cst.ClassDef) -> None:
        self._exit()
        self.classes.pop()

    def visit_Lambda(self, node: cst.Lambda) -> Optional[bool]:
        walk(node.params, self)  # defaults, in the enclosing scope
        self.lambdas += 1
        self._enter("lambda")
        self._bind_params(node.params)
        walk(node.body, self)
        self._exit()
        self.lambdas -= 1
        return False

    def visit_ListComp(self, node) -> None:
        self._enter("comprehension")

    def leave_ListComp(self, node) -> None:
        self._exit()

    visit_SetComp = visit_DictComp = visit_GeneratorExp = visit_ListComp
    leave_SetComp = leave_DictComp = leave_GeneratorExp = leave_ListComp

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target)
        self._flows(node.target, node.iter)

    # bindings that are not imports
    def _flows(self, target: cst.CSTNode, value: cst.BaseExpression) -> None:
        """A value flows into the names ``target`` binds (data flow for the rules, not a constant)."""
        for name in bound_names(target):
            self.index.assigns.append(self._site(AssignSite, target, dotted=name, value=value))

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target)
        self._flows(node.target, node.iter)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(node.asname.name)
            self._flows(node.asname.name, node.item)

    def visit_With(self, node: cst.With) -> None:
        for item in node.items:
            self.index.with_statements[id(item.item)] = node

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind(node.name.name)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target)
        self._flows(node.target, node.value)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        scope = self.names
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent  # := in a comprehension binds in the enclosing function
        self._bind(node.target, scope)
        self._flows(node.target, node.value)

    def visit_Del(self, node: cst.Del) -> None:
        self._bind(node.target)

    def visit_Global(self, node: cst.Global) -> None:
        self.names.declared.update(item.name.value for item in node.names)

    visit_Nonlocal = visit_Global

    def visit_MatchAs(self, node) -> None:
        if node.name is not None:
            self._bind(node.name)

    def visit_MatchStar(self, node) -> None:
        if node.name is not None:
            self._bind(node.name)

    def visit_MatchMapping(self, node) -> None:
        if node.rest is not None:
            self._bind(node.rest)

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

    def _import_binds(self, local: str, qualified: str) -> None:
        self.names.imports[local] = qualified
        self.imported.add(local)
        if self.names.kind == "module":
            self.index.aliases[local] = qualified

    def _imported(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted_name(alias.name)
            if full is None:
                continue
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self._import_binds(alias.asname.name.value, full)
            else:
                head = full.split(".")[0]
                self._import_binds(head, head)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> bool:
        self._imported_from(node)
        return False

    def _imported_from(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        module = dotted_name(node.module) if node.module is not None and not node.relative else None
        for alias in node.names:
            name = alias.name.value if isinstance(alias.name, cst.Name) else None
            if name is None:
                continue
            local = alias.asname.name.value if alias.asname and isinstance(alias.asname.name, cst.Name) else name
            if module is None:
                self.names.bound.add(local)  # a relative import: one of the project's own modules
                continue
            self._import_binds(local, f"{module}.{name}")
            if self.names.kind == "module":
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
        if node.value in self.imported:
            self.index.refs.append(
                self._site(RefSite, node, dotted=node.value, is_call_func=id(node) in self.call_funcs)
            )

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target)
            self._assigned(target.target, node.value)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target)
        if node.value is not None:
            self._assigned(node.target, node.value)

    def _assigned(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Attribute):
            dotted = dotted_name(target)
            if dotted is not None:
                self.index.assigns.append(self._site(AssignSite, target, dotted=dotted, value=value))
            return
        self._flows(target, value)
        if isinstance(target, cst.Name) and not self.functions and not self.classes:
            value_number = number(value, self.index.constants)
            if value_number is not None:
                self.index.constants[target.value] = value_number
            else:
                self.index.constants.pop(target.value, None)

    def visit_Comparison(self, node: cst.Comparison) -> None:
        self.index.held_as_data.add(id(node.left))
        self.index.held_as_data.update(id(target.comparator) for target in node.comparisons)

    def visit_Tuple(self, node) -> None:
        self.index.held_as_data.update(id(element.value) for element in node.elements)

    visit_List = visit_Set = visit_Tuple

    def visit_Dict(self, node: cst.Dict) -> None:
        self.index.held_as_data.update(id(element.key) for element in node.elements if isinstance(element, cst.DictElement))

    def visit_BinaryOperation(self, node: cst.BinaryOperation) -> None:
        self.index.binops.append(self._site(Site, node))

    def visit_AssignTarget(self, node: cst.AssignTarget) -> Optional[bool]:
        # the target of ``a.b = v`` is a store, recorded by visit_Assign; its value is still visited
        return False if isinstance(node.target, (cst.Attribute, cst.Name)) else None


def build_index(module: cst.Module) -> Index:
    index = Index()
    walk(module, _Collector(index))
    return index
