"""PCL504 tf32-flags: TF32 switches that raise, silently flip, or leak into other people's programs."""
from __future__ import annotations

import re
from typing import Iterator, List, Tuple

import libcst as cst

from preclint.core.findings import Finding
from preclint.rules.base import SourceRule
from preclint.text.args import is_name, keyword

LEGACY_FLAGS = ("torch.backends.cuda.matmul.allow_tf32", "torch.backends.cudnn.allow_tf32")
LEGACY_CALLS = ("torch.set_float32_matmul_precision", "torch.get_float32_matmul_precision")
CUDNN_FLAGS = "torch.backends.cudnn.flags"


def _is_new(qualified: str) -> bool:
    """The fp32_precision API of torch >= 2.9: ``torch.backends[.<backend>[.<op>]].fp32_precision``."""
    return qualified.startswith("torch.backends") and qualified.endswith(".fp32_precision")


class Tf32Flags(SourceRule):
    code = "PCL504"
    name = "tf32-flags"
    summary = "TF32 switches that raise, reset themselves, or change TF32 for every importer."
    severity = "warning"
    precisions = ("tf32",)
    # a TF32 switch, or cudnn's flags() (``torch.backends.cudnn.flags``, ``from ...cudnn import flags``)
    triggers = (
        ("torch",),
        ("tf32", "float32_matmul_precision", "fp32_precision", re.compile(r"cudnn[\s\S]*?(?<![A-Za-z0-9])flags(?![A-Za-z0-9])")),
    )
    why = """
Three ways TF32 settings go wrong, all visible in the source:

1. Mixing the legacy switches (`torch.backends.cuda.matmul.allow_tf32`, `torch.backends.cudnn.allow_tf32`,
   `torch.set_float32_matmul_precision`) with the `fp32_precision` API of torch >= 2.9 in one program:
   when the legacy API reads a TF32 state that the new one set differently (for example
   `torch.backends.cuda.matmul.allow_tf32` after `fp32_precision = "tf32"`, or
   `torch.backends.cudnn.allow_tf32` after `cudnn.conv.fp32_precision = "ieee"`), torch raises
   `RuntimeError: ... you have used mix of the legacy and new APIs to set the TF32 status`, in your code,
   in torch.compile / Inductor, or in a library.
2. `torch.backends.cudnn.flags(...)` sets every flag it has, and its `allow_tf32` defaults to True:
   inside `with torch.backends.cudnn.flags(enabled=True, deterministic=True):` cuDNN convolutions run in
   TF32 even where the program switched TF32 off (pytorch#145472). With `enabled=False` cuDNN is off in
   the block, but code there that reads `torch.backends.cudnn.allow_tf32` (tolerance helpers, nested
   flags) still sees True.
3. A TF32 switch executed when a library module is imported changes the numerics of every program
   that imports it, far from where anyone would look. Scripts (under `if __name__ == "__main__":`, or
   files starting with `#!`), tests and conftest.py are exempt.
"""
    example = """
# mylib/layers.py
import torch
torch.backends.cuda.matmul.allow_tf32 = True          # import-time switch (3)
torch.backends.cudnn.conv.fp32_precision = "ieee"     # mixed with the new API (1)

with torch.backends.cudnn.flags(enabled=True, deterministic=True):   # TF32 back on (2)
    y = conv(x)
"""
    fix = """
(1) Use one API: in torch >= 2.9, only `fp32_precision` (`torch.backends.cuda.matmul.fp32_precision =
"tf32"` or `"ieee"`, `torch.backends.cudnn.conv.fp32_precision = ...`). (2) Pass `allow_tf32=` to
`cudnn.flags(...)` explicitly: `allow_tf32=torch.backends.cudnn.allow_tf32` keeps the current setting.
(3) Set TF32 in the program's entry point (main, a CLI flag, a test fixture), or scope it with
`torch.backends.cudnn.flags(...)` around the code that needs it.
"""
    valid = (
        """
import torch

if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    main()
""",
        """
import torch

def main():
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "tf32"
""",
        """
import torch

def test_conv():
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        y = conv(x)
""",
    )
    invalid = (
        """
import torch

torch.backends.cuda.matmul.allow_tf32 = True
""",
        """
import torch

def setup():
    torch.backends.cuda.matmul.fp32_precision = "ieee"
    if torch.backends.cudnn.allow_tf32:
        print("tf32")
""",
        """
import torch

def test_conv():
    with torch.backends.cudnn.flags(enabled=True, deterministic=True):
        y = conv(x)
""",
        """
from torch.backends import cudnn

@cudnn.flags(enabled=False)
def check():
    pass
""",
        """
import torch

torch.set_float32_matmul_precision("high")
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        index = source.index
        legacy: List[Tuple[cst.CSTNode, str, object]] = []  # (node, qualified name, site)
        new: List[Tuple[cst.CSTNode, str, object]] = []
        # a flag read (not a call's callee) or assigned
        for site in [s for s in index.refs if not s.is_call_func] + list(index.assigns):
            qualified = index.qualify(site.dotted, site)
            if qualified in LEGACY_FLAGS:
                legacy.append((site.node, qualified, site))
            elif qualified and _is_new(qualified):
                new.append((site.node, qualified, site))
        for site in index.calls:
            qualified = index.qualify(site.dotted, site)
            if qualified in LEGACY_CALLS:
                legacy.append((site.node, qualified, site))
            elif qualified == CUDNN_FLAGS:
                if keyword(site.node, "allow_tf32") is not None:
                    legacy.append((site.node, qualified + "(allow_tf32=...)", site))
                if keyword(site.node, "fp32_precision") is not None:
                    new.append((site.node, qualified + "(fp32_precision=...)", site))
                yield from self._cudnn_flags(source, site)

        # (1) both APIs in one file: report each legacy use, pointing at the first new one
        if legacy and new:
            first_new = min(new, key=lambda item: source.location(item[0]))
            line = source.location(first_new[0]).line
            for node, qualified, _ in legacy:
                yield source.report(
                    self, node,
                    f"`{qualified}` mixes the legacy TF32 API with `{first_new[1]}` (line {line}): torch >= 2.9 "
                    "raises RuntimeError when the legacy API reads a TF32 state the new one set differently.",
                    "Use only the fp32_precision API (`torch.backends.cuda.matmul.fp32_precision`, "
                    "`torch.backends.cudnn.conv.fp32_precision`).",
                    severity="error",
                )

        # (3) switches executed on import of library code
        if source.is_test or source.is_script:
            return
        for site in index.assigns:
            qualified = index.qualify(site.dotted, site)
            if site.import_time and (qualified in LEGACY_FLAGS or (qualified and _is_new(qualified))):
                yield self._import_time(source, site.node, qualified)
        for site in index.calls:
            qualified = index.qualify(site.dotted, site)
            if site.import_time and qualified == "torch.set_float32_matmul_precision":
                yield self._import_time(source, site.node, qualified)

    def _import_time(self, source, node, qualified: str) -> Finding:
        return source.report(
            self, node,
            f"`{qualified}` is set when this module is imported: it changes TF32 for every program "
            "that imports it.",
            "Set TF32 in the program's entry point (under `if __name__ == \"__main__\":`, a CLI flag, "
            "a test fixture), not at import time of library code.",
        )

    def _cudnn_flags(self, source, site) -> Iterator[Finding]:
        call = site.node
        if keyword(call, "allow_tf32") is not None or keyword(call, "fp32_precision") is not None:
            return
        if any(arg.star for arg in call.args) or any(arg.keyword is None for arg in call.args[4:5]):
            return  # allow_tf32 may be in *args/**kwargs, or passed fifth by position
        enabled = keyword(call, "enabled")
        if enabled is None and call.args and call.args[0].keyword is None:
            enabled = call.args[0].value
        cudnn_on = enabled is not None and not is_name(enabled, "False")
        if cudnn_on:
            message = (
                "`torch.backends.cudnn.flags(...)` without `allow_tf32=` turns TF32 on for cuDNN inside "
                "the block, whatever the program set."
            )
            severity = "warning"
        else:
            message = (
                "`torch.backends.cudnn.flags(...)` without `allow_tf32=` sets `torch.backends.cudnn.allow_tf32` "
                "to True inside the block (cuDNN itself is off there)."
            )
            severity = "info"
        yield source.report(
            self, call, message,
            "Pass `allow_tf32=` explicitly: `allow_tf32=torch.backends.cudnn.allow_tf32` keeps the current "
            "setting, `allow_tf32=False` keeps convolutions in full fp32.",
            severity=severity,
        )
