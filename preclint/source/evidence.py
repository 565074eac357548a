"""Which reduced precision the code shows, read from the source: an autocast block, ``.half()``,
``dtype=torch.float16``, TF32 switched on. Rules that only matter in reduced precision (PCL501,
PCL505) ask for the evidence around the line they look at, and cite it in their message.

Evidence is looked up for a *place*: the function the line is in (the test), the module-level code,
and for a method the body of its class and its ``setUp``/``setUpClass``. Another test function in the
same file does not count: a file may test fp32 and fp16 side by side.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple

import libcst as cst

from preclint.numerics import BF16, FP16, TF32, Format
from preclint.source.args import code, is_name, keyword, positional, string
from preclint.source.index import CallSite, Index, Site, dotted_name

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


def dtype_format(node: Optional[cst.BaseExpression], index: Index) -> Optional[Format]:
    """The low format a dtype expression names (``torch.float16``, ``np.float16``, ``"bfloat16"``)."""
    if node is None:
        return None
    text = string(node)
    if text is not None:
        return DTYPE_STRINGS.get(text)
    return LOW_DTYPES.get(index.qualify(dotted_name(node)) or "")


def autocast_format(call: cst.Call, qualified: str, index: Index) -> Tuple[bool, Optional[Format]]:
    """Whether the call opens an autocast region, and its low format (None when the device is a
    variable and no dtype is given)."""
    if qualified not in AUTOCAST_DEFAULTS:
        return False, None
    enabled = keyword(call, "enabled")
    if isinstance(enabled, cst.Name) and enabled.value == "False":
        return False, None
    fmt = dtype_format(keyword(call, "dtype"), index)
    if fmt is not None:
        return True, fmt
    default = AUTOCAST_DEFAULTS[qualified]
    if default is not None:
        return True, default
    device = string(keyword(call, "device_type") or positional(call, 0))
    return True, DEVICE_DEFAULTS.get(device.split(":")[0]) if device else None


def _call_evidence(site: CallSite, index: Index) -> Iterable[Evidence]:
    call = site.node
    qualified = index.qualify(site.dotted)
    if qualified:
        is_autocast, fmt = autocast_format(call, qualified, index)
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
            fmt = dtype_format(positional(call, 0), index)
            if fmt is not None:
                yield Evidence(fmt, CAST, call, qualified)
            return
    if site.method in ("half", "bfloat16") and not call.args:
        yield Evidence(FP16 if site.method == "half" else BF16, CAST, call, f".{site.method}()")
    elif site.method in ("to", "type", "astype"):
        for arg in call.args:
            if arg.keyword is None or arg.keyword.value == "dtype":
                fmt = dtype_format(arg.value, index)
                if fmt is not None:
                    yield Evidence(fmt, CAST, call, f".{site.method}({code(arg.value)})")
                    return
    fmt = dtype_format(keyword(call, "dtype"), index)
    if fmt is not None:
        yield Evidence(fmt, CAST, call, f"dtype={code(keyword(call, 'dtype'))}")


def _truthy(node: Optional[cst.BaseExpression]) -> bool:
    return is_name(node, "True")


def _assign_evidence(site, index: Index) -> Iterable[Evidence]:
    qualified = index.qualify(site.dotted)
    if qualified in TF32_LEGACY_FLAGS and _truthy(site.value):
        yield Evidence(TF32, TF32_MODE, site.node, qualified)
    elif qualified and qualified.startswith("torch.backends.") and qualified.endswith(".fp32_precision"):
        if string(site.value) == "tf32":
            yield Evidence(TF32, TF32_MODE, site.node, qualified)


def _ref_evidence(site, index: Index) -> Iterable[Evidence]:
    qualified = index.qualify(site.dotted)
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
        self._setup_scopes: Dict[int, List[int]] = {}  # id(class) -> ids of its setUp methods
        for site in index.calls:
            self._add(site, _call_evidence(site, index))
        for site in index.assigns:
            self._add(site, _assign_evidence(site, index))
        for site in index.refs:
            if not site.is_call_func:
                self._add(site, _ref_evidence(site, index))

    def _add(self, site: Site, items: Iterable[Evidence]) -> None:
        for item in items:
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
