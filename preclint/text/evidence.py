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
        self._flows: Optional[Dict[str, List[Site]]] = None
        self._regions: Dict[int, Set[int]] = {}

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
        module docstring."""
        nodes, assignments = self._slice(site, values)
        found: List[Evidence] = []
        for evidence in self.around(site):
            if evidence.kind == TF32_MODE:
                found.append(evidence)
            elif evidence.kind == AUTOCAST:
                region = self.index.with_statements.get(id(evidence.node))
                if region is None:  # a decorator, or a context manager kept in a variable: its function
                    found.append(evidence)
                    continue
                inside = self._region(region)
                if any(id(place) in inside for place in [site.node] + assignments):
                    found.append(evidence)
            elif id(evidence.node) in nodes:
                found.append(evidence)
        return found

    def _slice(self, site: Site, values: Sequence[cst.BaseExpression]) -> Tuple[Set[int], List[cst.CSTNode]]:
        """The ids of every node in the backward slice of ``values`` at ``site``, and the assignments
        (target nodes) it went through. A name read in a scope leads to the assignments of the scope
        that binds it there (a comprehension's own variable first), as Python resolves it."""
        if self._flows is None:
            self._flows = {}
            for assign in self.index.assigns:
                if assign.value is not None:
                    self._flows.setdefault(assign.dotted, []).append(assign)
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
        candidates = self._flows.get(name, ())
        if "." in name:  # ``self.model``: assigned in any method of the class, or where it is read
            return [a for a in candidates if (a.klass is not None and a.klass is site.klass)
                    or a.scope is site.scope]
        inner = [a for a in candidates if a.names is not None and a.names.kind == "comprehension"
                 and _encloses(reading, a.names)]
        if inner:
            return inner
        binder = _binder(reading, name)
        return [a for a in candidates if binder is not None and a.names is binder]


def _binder(scope, name: str):
    """The scope a read of ``name`` in ``scope`` resolves to (class bodies do not enclose functions)."""
    past_function = False
    while scope is not None:
        if not (scope.kind == "class" and past_function) and (name in scope.bound or name in scope.imports):
            return scope
        past_function = past_function or scope.kind in ("function", "lambda", "comprehension")
        scope = scope.parent
    return None


def _encloses(outer, inner) -> bool:
    """Whether ``inner`` is ``outer`` or nested in it."""
    while inner is not None:
        if inner is outer:
            return True
        inner = inner.parent
    return False


def _all_params(function: cst.FunctionDef) -> List[cst.Param]:
    params = function.params
    found = [*params.posonly_params, *params.params, *params.kwonly_params]
    found += [p for p in (params.star_arg, params.star_kwarg) if isinstance(p, cst.Param)]
    return found


def _parameters(function: cst.FunctionDef) -> Set[str]:
    return {param.name.value for param in _all_params(function)}
