"""Which reduced precision the code shows, read from the source: an autocast block, ``.half()``,
``dtype=torch.float16``, TF32 switched on. Rules that only matter in reduced precision (PCL501,
PCL505) ask for the evidence around the line they look at, and cite it in their message.

Evidence is looked up for a *place*: the function the line is in (the test), the module-level code,
and for a method the body of its class and its ``setUp``/``setUpClass``. Another test function in the
same file does not count: a file may test fp32 and fp16 side by side.

For the values a check compares, ``reaching(site, values)`` is narrower: a cast (``.half()``,
``dtype=torch.float16``) or a dtype named (``for dtype in [np.half, np.float32]``) counts only where
it flows into those values: in their expressions, or in what is assigned to the names they read, and
so on back through the function, the module's globals, ``self.*`` attributes of the class and the
decorators and defaults of the function's parameters (``@dtypes(torch.half)``). An autocast block
counts where the values (or what they are computed from) are assigned inside it; TF32 switched on
counts in the function, its class's setUp and at module level, as it changes every matmul after it.
A dtype named 4,000 lines away in another test no longer makes a float32 check look like an fp16 one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

import libcst as cst

from preclint.core.numerics import BF16, FP16, TF32, Format
from preclint.text.args import code, is_name, keyword, positional, string
from preclint.text.index import CallSite, Index, Site, descendants, dotted_name

CAST = "cast"  # values stored in the low format: .half(), dtype=torch.float16
AUTOCAST = "autocast"  # autocast regions: only autocast's op lists run in the low format
TF32_MODE = "tf32"  # fp32 values, TF32 matmuls/convolutions
MENTION = "mention"  # a low dtype named somewhere (a comparison, a parameter list): shows intent only

LOW_DTYPES = {
    "torch.float16": FP16,
    "torch.half": FP16,
    "torch.bfloat16": BF16,
    "numpy.float16": FP16,
    "numpy.half": FP16,
}
DTYPE_STRINGS = {"float16": FP16, "half": FP16, "bfloat16": BF16, "fp16": FP16, "bf16": BF16}
AUTOCAST_DEFAULTS = {
    "torch.autocast": None,  # depends on device_type
    "torch.amp.autocast": None,
    "torch.amp.autocast_mode.autocast": None,
    "torch.cuda.amp.autocast": FP16,
    "torch.cpu.amp.autocast": BF16,
}
DEVICE_DEFAULTS = {"cuda": FP16, "cpu": BF16, "xpu": FP16, "mps": FP16, "hpu": BF16}
TF32_LEGACY_FLAGS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")
# TensorRT builder flags, as in exported-engine tests that compare against fp32 with numpy
TENSORRT_FLAGS = {"BuilderFlag.FP16": FP16, "BuilderFlag.BF16": BF16, "BuilderFlag.TF32": TF32}


@dataclass(frozen=True)
class Evidence:
    fmt: Optional[Format]  # None: reduced precision of a kind the source does not pin down
    kind: str  # CAST, AUTOCAST, TF32_MODE or MENTION
    node: cst.CSTNode
    text: str  # how it reads in the code: "torch.autocast", ".half()", "torch.float16"


def dtype_format(node: Optional[cst.BaseExpression], index: Index, at: Optional[Site] = None) -> Optional[Format]:
    """The low format a dtype expression names (``torch.float16``, ``np.float16``, ``"bfloat16"``)."""
    if node is None:
        return None
    text = string(node)
    if text is not None:
        return DTYPE_STRINGS.get(text)
    return LOW_DTYPES.get(index.qualify(dotted_name(node), at) or "")


def autocast_format(call: cst.Call, qualified: str, index: Index, at: Optional[Site] = None) -> Tuple[bool, Optional[Format]]:
    """Whether the call opens an autocast region, and its low format (None when the device is a
    variable and no dtype is given)."""
    if qualified not in AUTOCAST_DEFAULTS:
        return False, None
    enabled = keyword(call, "enabled")
    if isinstance(enabled, cst.Name) and enabled.value == "False":
        return False, None
    fmt = dtype_format(keyword(call, "dtype"), index, at)
    if fmt is not None:
        return True, fmt
    default = AUTOCAST_DEFAULTS[qualified]
    if default is not None:
        return True, default
    device = string(keyword(call, "device_type") or positional(call, 0))
    return True, DEVICE_DEFAULTS.get(device.split(":")[0]) if device else None


def _call_evidence(site: CallSite, index: Index) -> Iterable[Evidence]:
    call = site.node
    qualified = index.qualify(site.dotted, site)
    if qualified:
        is_autocast, fmt = autocast_format(call, qualified, index, site)
        if is_autocast:
            yield Evidence(fmt, AUTOCAST, call, qualified)
            return
        if qualified == "torch.set_float32_matmul_precision":
            level = string(positional(call, 0) or keyword(call, "precision"))
            if level == "high":
                yield Evidence(TF32, TF32_MODE, call, qualified)
            elif level == "medium":
                yield Evidence(BF16, TF32_MODE, call, qualified)
            return
        if qualified in ("torch.backends.cudnn.flags",):
            if _truthy(keyword(call, "allow_tf32")) or string(keyword(call, "fp32_precision")) == "tf32":
                yield Evidence(TF32, TF32_MODE, call, qualified)
            return
        if qualified == "torch.set_default_dtype":
            fmt = dtype_format(positional(call, 0), index, site)
            if fmt is not None:
                yield Evidence(fmt, CAST, call, qualified)
            return
    if site.method in ("half", "bfloat16") and not call.args:
        yield Evidence(FP16 if site.method == "half" else BF16, CAST, call, f".{site.method}()")
    elif site.method in ("to", "type", "astype"):
        for arg in call.args:
            if arg.keyword is None or arg.keyword.value == "dtype":
                fmt = dtype_format(arg.value, index, site)
                if fmt is not None:
                    yield Evidence(fmt, CAST, call, f".{site.method}({code(arg.value)})")
                    return
    fmt = dtype_format(keyword(call, "dtype"), index, site)
    if fmt is not None:
        yield Evidence(fmt, CAST, call, f"dtype={code(keyword(call, 'dtype'))}")


def _truthy(node: Optional[cst.BaseExpression]) -> bool:
    return is_name(node, "True")


def _assign_evidence(site, index: Index) -> Iterable[Evidence]:
    qualified = index.qualify(site.dotted, site)
    if qualified in TF32_LEGACY_FLAGS and _truthy(site.value):
        yield Evidence(TF32, TF32_MODE, site.node, qualified)
    elif qualified and qualified.startswith("torch.backends.") and qualified.endswith(".fp32_precision"):
        if string(site.value) == "tf32":
            yield Evidence(TF32, TF32_MODE, site.node, qualified)


def _ref_evidence(site, index: Index) -> Iterable[Evidence]:
    qualified = index.qualify(site.dotted, site)
    if qualified in LOW_DTYPES:
        yield Evidence(LOW_DTYPES[qualified], MENTION, site.node, site.dotted)
        return
    for suffix, fmt in TENSORRT_FLAGS.items():
        if site.dotted.endswith(suffix):
            yield Evidence(fmt, CAST, site.node, site.dotted)


class EvidenceMap:
    """Evidence of a file, grouped by where it occurs."""

    def __init__(self, index: Index):
        self.index = index
        self.by_scope: Dict[Optional[int], List[Evidence]] = {}
        self.by_class: Dict[int, List[Evidence]] = {}
        self.sites: Dict[int, Site] = {}  # id(evidence node) -> the site it was found at
        for site in index.calls:
            self._add(site, _call_evidence(site, index))
        for site in index.assigns:
            self._add(site, _assign_evidence(site, index))
        for site in index.refs:
            if not site.is_call_func:
                self._add(site, _ref_evidence(site, index))
        self._flows: Optional[_Flows] = None
        self._regions: Dict[int, Set[int]] = {}
        self._groups: Dict[int, _Group] = {}  # id(list of by_scope or by_class) -> its lookups

    def _region(self, statement: cst.With) -> Set[int]:
        """The ids of the nodes inside a with block's body."""
        region = self._regions.get(id(statement))
        if region is None:
            region = self._regions[id(statement)] = {id(node) for node in descendants(statement.body)}
        return region

    def _add(self, site: Site, items: Iterable[Evidence]) -> None:
        for item in items:
            self.sites[id(item.node)] = site
            if site.scope is None:
                if site.klass is not None:
                    self.by_class.setdefault(id(site.klass), []).append(item)
                else:
                    self.by_scope.setdefault(None, []).append(item)
            else:
                self.by_scope.setdefault(id(site.scope), []).append(item)
                if site.klass is not None and site.scope.name.value in ("setUp", "setUpClass"):
                    self.by_class.setdefault(id(site.klass), []).append(item)

    def around(self, site: Site) -> List[Evidence]:
        """Evidence that applies at ``site``: its function, its class, the module level."""
        found = list(self.by_scope.get(id(site.scope), [])) if site.scope is not None else []
        if site.klass is not None:
            found += self.by_class.get(id(site.klass), [])
        found += self.by_scope.get(None, [])
        return found

    def everywhere(self) -> List[Evidence]:
        found = []
        for items in self.by_scope.values():
            found += items
        for items in self.by_class.values():
            found += items
        return found

    # ------------------------------------------------------------------------ data flow

    def reaching(self, site: Site, values: Sequence[cst.BaseExpression]) -> List[Evidence]:
        """Evidence that reaches ``values`` (the expressions a check at ``site`` compares): see the
        module docstring. The evidence of ``around(site)`` that a cast or mention in the slice, an
        autocast block around the check or an assignment in it, or TF32 makes reach, in that order;
        found by looking up the slice's nodes, so that a check costs its slice, not the evidence of
        its whole function, class and module."""
        nodes, assignments = self._slice(site, values)
        places = [site.node] + assignments
        found: List[Evidence] = []
        for items in self._around_lists(site):
            found += self._group(items).reaching(nodes, places)
        return found

    def _around_lists(self, site: Site) -> List[List[Evidence]]:
        """The lists ``around`` joins, in its order."""
        lists = [self.by_scope.get(id(site.scope), [])] if site.scope is not None else []
        if site.klass is not None:
            lists.append(self.by_class.get(id(site.klass), []))
        lists.append(self.by_scope.get(None, []))
        return [items for items in lists if items]

    def _group(self, items: List[Evidence]) -> "_Group":
        group = self._groups.get(id(items))
        if group is None:
            group = self._groups[id(items)] = _Group(items, self.index, self._region)
        return group

    def _slice(self, site: Site, values: Sequence[cst.BaseExpression]) -> Tuple[Set[int], List[cst.CSTNode]]:
        """The ids of every node in the backward slice of ``values`` at ``site``, and the assignments
        (target nodes) it went through. A name read in a scope leads to the assignments of the scope
        that binds it there (a comprehension's own variable first), as Python resolves it."""
        if self._flows is None:
            self._flows = _Flows(self.index.assigns)
        nodes: Set[int] = set()
        assignments: List[cst.CSTNode] = []
        pending = [(value, site.names) for value in values if value is not None]
        seen: Set[Tuple[str, int]] = set()
        function = site.scope
        parameters = _parameters(function) if function is not None else set()
        while pending:
            expression, reading = pending.pop()
            names = []
            for node in descendants(expression):
                nodes.add(id(node))
                if isinstance(node, cst.Name):
                    names.append(node.value)
                elif isinstance(node, cst.Attribute):
                    dotted = dotted_name(node)
                    if dotted is not None:
                        parts = dotted.split(".")
                        names += [".".join(parts[: i + 1]) for i in range(1, len(parts))]
            for name in names:
                if (name, id(reading)) in seen:
                    continue
                seen.add((name, id(reading)))
                for assign in self._feeding(name, reading, site):
                    if len(assignments) >= MAX_SLICE_ASSIGNMENTS:
                        break
                    assignments.append(assign.node)
                    pending.append((assign.value, assign.names))
                binder = _binder(reading, name) if name in parameters else None
                if binder is not None and binder.kind == "function":
                    # a parameter: what its decorators (``@dtypes(torch.half)``) and default say
                    pending += [(decorator.decorator, site.names) for decorator in function.decorators]
                    pending += [(p.default, site.names) for p in _all_params(function)
                                if p.name.value == name and p.default is not None]
        return nodes, assignments

    def _feeding(self, name: str, reading, site: Site) -> List[Site]:
        """The assignments a read of ``name`` in the scope ``reading`` can see."""
        flows = self._flows
        if "." in name:  # ``self.model``: assigned in any method of the class, or where it is read
            return flows.of_class_or_function(name, site.klass, site.scope)
        inner = flows.in_comprehensions_within(name, reading)
        if inner:
            return inner
        binder = _binder(reading, name)
        return flows.in_namespace(name, binder) if binder is not None else []


# The assignments a check's backward slice follows at most. Each check rebuilds its slice, so a value
# built by a chain of n assignments (``a2 = a1.half()``, ``a3 = a2.half()``, ... each compared), or one
# name reassigned n times, cost n per check and n^2 per file; past this many the evidence of the
# enclosing function, class and module still applies, and a cast further back than this in one flow
# is not what a reader of the check sees either.
MAX_SLICE_ASSIGNMENTS = 32


class _Flows:
    """The assignments of a value, keyed the ways ``_feeding`` asks for them, each list in file order:
    a lookup costs what it finds, not the number of assignments to the name in the file."""

    def __init__(self, assigns: Sequence[Site]):
        self.order: Dict[int, int] = {}  # id(assignment) -> its place in the file
        self.by_namespace: Dict[Tuple[str, int], List[Site]] = {}  # (name, id(namespace it binds in))
        self.by_class: Dict[Tuple[str, int], List[Site]] = {}  # (dotted name, id(innermost class))
        self.by_function: Dict[Tuple[str, int], List[Site]] = {}  # (dotted name, id(outermost function))
        # (name, id(a namespace at or around a comprehension that binds it)) -> those assignments
        self.comprehensions: Dict[Tuple[str, int], List[Site]] = {}
        for assign in assigns:
            if assign.value is None:
                continue
            name = assign.dotted
            self.order[id(assign)] = len(self.order)
            self.by_namespace.setdefault((name, id(assign.names)), []).append(assign)
            if assign.klass is not None:
                self.by_class.setdefault((name, id(assign.klass)), []).append(assign)
            self.by_function.setdefault((name, id(assign.scope)), []).append(assign)
            if assign.names is not None and assign.names.kind == "comprehension":
                scope = assign.names
                while scope is not None:
                    self.comprehensions.setdefault((name, id(scope)), []).append(assign)
                    scope = scope.parent

    def of_class_or_function(self, name: str, klass, function) -> List[Site]:
        """Assignments to ``name`` in the class ``klass`` (if any) or in the outermost function
        ``function`` (None: at module or class level)."""
        in_class = self.by_class.get((name, id(klass)), []) if klass is not None else []
        in_function = self.by_function.get((name, id(function)), [])
        if not in_class or not in_function:
            return list(in_class or in_function)
        both = {id(a): a for a in in_class + in_function}
        return sorted(both.values(), key=lambda a: self.order[id(a)])

    def in_comprehensions_within(self, name: str, scope) -> List[Site]:
        """Assignments to ``name`` by comprehensions that are ``scope`` or nested in it."""
        return self.comprehensions.get((name, id(scope)), [])

    def in_namespace(self, name: str, scope) -> List[Site]:
        return self.by_namespace.get((name, id(scope)), [])


class _Group:
    """One list of evidence ``around`` joins (a function's, a class's, the module's), with lookups
    from the nodes of a slice to the evidence it reaches."""

    def __init__(self, items: List[Evidence], index: Index, region):
        self.items = items
        self.always: List[int] = []  # positions in items: TF32, autocast without a block of its own
        self.by_node: Dict[int, List[int]] = {}  # id(node) -> positions of casts and mentions there
        self.in_block: Dict[int, List[int]] = {}  # id(node in an autocast block) -> the block's positions
        for position, evidence in enumerate(items):
            if evidence.kind == TF32_MODE:
                self.always.append(position)
            elif evidence.kind == AUTOCAST:
                statement = index.with_statements.get(id(evidence.node))
                if statement is None:  # a decorator, or a context manager kept in a variable: its function
                    self.always.append(position)
                else:
                    for node in region(statement):
                        self.in_block.setdefault(node, []).append(position)
            else:
                self.by_node.setdefault(id(evidence.node), []).append(position)

    def reaching(self, nodes: Set[int], places: Sequence[cst.CSTNode]) -> List[Evidence]:
        chosen = set(self.always)
        if len(nodes) < len(self.by_node):
            for node in nodes:
                chosen.update(self.by_node.get(node, ()))
        else:
            for node, positions in self.by_node.items():
                if node in nodes:
                    chosen.update(positions)
        for place in places:
            chosen.update(self.in_block.get(id(place), ()))
        return [self.items[position] for position in sorted(chosen)]


def _binder(scope, name: str):
    """The scope a read of ``name`` in ``scope`` resolves to (class bodies do not enclose functions)."""
    past_function = False
    while scope is not None:
        if not (scope.kind == "class" and past_function) and (name in scope.bound or name in scope.imports):
            return scope
        past_function = past_function or scope.kind in ("function", "lambda", "comprehension")
        scope = scope.parent
    return None


def _all_params(function: cst.FunctionDef) -> List[cst.Param]:
    params = function.params
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    found += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return found


def _parameters(function: cst.FunctionDef) -> Set[str]:
    return {param.name.value for param in _all_params(function)}
