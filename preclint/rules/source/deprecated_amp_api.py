"""PCL502 deprecated-amp-api: the device-specific AMP entry points that torch.amp replaced."""
from __future__ import annotations

from typing import Iterator, List, Optional, Tuple

import libcst as cst

from preclint.core.findings import Finding
from preclint.rules.base import SourceRule
from preclint.text.args import has_star, keyword_arg, with_arguments, with_first_argument

# deprecated qualified name -> (what replaces it, device)
DEPRECATED = {
    "torch.cuda.amp.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", "cuda"),
    "torch.cpu.amp.autocast": ("autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("autocast", "cpu"),
    "torch.cuda.amp.GradScaler": ("GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("GradScaler", "cuda"),
    "torch.cpu.amp.GradScaler": ("GradScaler", "cpu"),
    "torch.cuda.amp.custom_fwd": ("custom_fwd", "cuda"),
    "torch.cuda.amp.custom_bwd": ("custom_bwd", "cuda"),
}
NEW_PATH = {"autocast": "autocast", "GradScaler": "amp.GradScaler", "custom_fwd": "amp.custom_fwd", "custom_bwd": "amp.custom_bwd"}
# torch.{cuda,cpu}.amp.autocast(enabled, dtype, cache_enabled): their positions, which torch.autocast
# does not share (its first parameter is the device), so positional arguments become keywords
AUTOCAST_PARAMS = ("enabled", "dtype", "cache_enabled")
# the dtype the old autocast classes default to (torch.autocast reads a global setting instead)
OLD_DTYPE = {"cuda": "float16", "cpu": "bfloat16"}


def _new_usage(kind: str, device: str) -> str:
    if kind in ("autocast", "GradScaler"):
        return f'torch.{NEW_PATH[kind]}("{device}", ...)'
    return f'torch.{NEW_PATH[kind]}(..., device_type="{device}")'


def _dotted(text: str) -> cst.BaseExpression:
    return cst.parse_expression(text)


class DeprecatedAmpApi(SourceRule):
    code = "PCL502"
    name = "deprecated-amp-api"
    summary = "`torch.cuda.amp` / `torch.cpu.amp` autocast, GradScaler and custom_fwd/bwd are deprecated."
    severity = "warning"
    precisions = ("fp16", "bf16")
    fixable = True
    triggers = (("torch",), ("amp",))  # the deprecated names are reached through an import from torch
    why = """
`torch.cuda.amp.autocast`, `torch.cpu.amp.autocast`, `torch.cuda.amp.GradScaler` and
`torch.cuda.amp.custom_fwd`/`custom_bwd` warn (FutureWarning) on every use since torch 2.4 and are
slated for removal; the device-generic `torch.autocast(device_type, ...)`, `torch.amp.GradScaler(device,
...)` and `torch.amp.custom_fwd(device_type=...)` replace them with the same behaviour. Code that mixes
the two makes it harder to see which regions run in reduced precision. (TorchFix's TOR101 flags the
autocast forms.)
"""
    example = """
with torch.cuda.amp.autocast(dtype=torch.float16):
    y = model(x)
scaler = torch.cuda.amp.GradScaler()
"""
    fix = """
Use `torch.autocast("cuda", ...)` (or `"cpu"`), `torch.amp.GradScaler("cuda", ...)` and
`torch.amp.custom_fwd(device_type="cuda")`. `--fix` rewrites calls: positional arguments of the old
autocast (enabled, dtype, cache_enabled) become keywords, since `torch.autocast` takes the device first,
and its default dtype is written out (`dtype=torch.float16` for cuda, `torch.bfloat16` for cpu: the old
classes passed it, `torch.autocast` reads `torch.get_autocast_dtype()` instead); `import torch` is added
when the file lacks it and a `from torch.cuda.amp import ...` left unused is removed. References that
are not calls (`cls = torch.cuda.amp.GradScaler`), autocast calls with `*args`, and calls where `torch`
names something else are reported without a fix; identity and equality tests against the old objects
(`fn is torch.cuda.amp.autocast`) and tables that list them are not reported. The one difference the fix leaves: the new objects
are not instances of the old classes (`isinstance(s, torch.cuda.amp.GradScaler)` elsewhere is False).
"""
    valid = (
        """
import torch

def is_old_autocast(fn):
    return fn is torch.cuda.amp.autocast or fn in (torch.cpu.amp.autocast,)
""",
        """
import torch

with torch.autocast("cuda", dtype=torch.float16):
    y = model(x)
scaler = torch.amp.GradScaler("cuda")
""",
        """
from torch.amp import autocast

with autocast("cpu"):
    y = model(x)
""",
        """
import torch

amp_level = "O1"  # an unrelated name that mentions amp
""",
    )
    invalid = (
        """
import torch

with torch.cuda.amp.autocast():
    y = model(x)
""",
        """
import torch

scaler = torch.cuda.amp.GradScaler(init_scale=1024)
""",
        """
from torch.cuda.amp import autocast

@autocast(enabled=False)
def forward(x):
    return x
""",
        """
import torch as th

class Fn(th.autograd.Function):
    @staticmethod
    @th.cuda.amp.custom_fwd
    def forward(ctx, x):
        return x
""",
        """
import torch

with torch.cpu.amp.autocast(True, torch.bfloat16):
    y = model(x)
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        index = source.index
        for ref, qualified, call in index.references(DEPRECATED):
            if call is None and id(ref.node) in index.held_as_data:
                continue  # ``fn is torch.cuda.amp.autocast``, a table of functions: naming the old object is no use of it
            kind, device = DEPRECATED[qualified]
            new = _new_usage(kind, device)
            message = f"`{qualified}` is deprecated; use `{new}`."
            replacement, why_not = self._replacement(kind, device, ref, call, index)
            if replacement is None:
                yield source.report(self, ref.node, message, f"Replace it with `{new}` by hand ({why_not}).")
                continue
            target, new_node, add, unused = replacement
            yield source.report(
                self, target, message, f"Replace it with `{new}` (fixable with --fix).",
                replacement=new_node, add_imports=add, unused_imports=unused,
            )

    def _replacement(self, kind: str, device: str, ref, call, index) -> Tuple[Optional[tuple], str]:
        """(node to replace, its replacement, imports to add, imports that may become unused), or
        (None, why there is no fix)."""
        root = ref.dotted.split(".")[0]
        add: Tuple[str, ...] = ()
        unused: Tuple[Tuple[str, str], ...] = ()
        if index.qualify(root, ref) == "torch":
            torch_name = root
        else:
            # the name came from ``from torch.cuda.amp import autocast`` (or similar): rewrite to the
            # torch module and let the fixer drop the import if nothing else uses it
            torch_name = index.torch_name(ref)
            if torch_name is None:
                if index.qualify("torch", ref) != "torch":
                    return None, "`torch` names something else here"
                torch_name, add = "torch", ("torch",)
            if root in index.from_imports:
                module, _, name = index.aliases.get(root, "").rpartition(".")
                unused = ((module, name),)
        new_func = _dotted(f"{torch_name}.{NEW_PATH[kind]}")
        device_string = cst.SimpleString(f'"{device}"')
        if kind in ("custom_fwd", "custom_bwd"):
            device_kw = keyword_arg("device_type", device_string)
            if call is None:  # ``@torch.cuda.amp.custom_fwd`` used bare as a decorator
                return (ref.node, cst.Call(func=new_func, args=[device_kw]), add, unused), ""
            new_call = with_arguments(call.node.with_changes(func=new_func), call.node.args, [device_kw])
            return (call.node, new_call, add, unused), ""
        if call is None:
            return None, "it is referenced, not called, so its arguments are unknown"
        if kind == "GradScaler":
            # the old positional parameters follow the device in torch.amp.GradScaler: prepend it
            new_call = with_first_argument(call.node.with_changes(func=new_func), cst.Arg(device_string))
            return (call.node, new_call, add, unused), ""
        if has_star(call.node):
            return None, "the call passes *args or **kwargs, whose positions torch.autocast does not share"
        args: List[cst.Arg] = []
        position = 0
        for arg in call.node.args:
            if arg.keyword is None:
                if position >= len(AUTOCAST_PARAMS):
                    return None, "the call passes more positional arguments than autocast takes"
                arg = keyword_arg(AUTOCAST_PARAMS[position], arg.value, arg.comma)
                position += 1
            args.append(arg)
        extra = []
        if not any(arg.keyword is not None and arg.keyword.value == "dtype" for arg in args):
            # the old class passed its own default; torch.autocast reads torch.get_autocast_dtype()
            extra.append(keyword_arg("dtype", _dotted(f"{torch_name}.{OLD_DTYPE[device]}")))
        new_call = with_arguments(call.node.with_changes(func=new_func), args, extra)
        return (call.node, with_first_argument(new_call, cst.Arg(device_string)), add, unused), ""
