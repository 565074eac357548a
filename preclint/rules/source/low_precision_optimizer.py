"""PCL507 low-precision-optimizer: a model cast to float16/bfloat16 handed to an optimizer."""
from __future__ import annotations

from typing import Dict, Iterator, Optional

import libcst as cst

from preclint.core.numerics import FP16
from preclint.core.findings import Finding
from preclint.rules.base import SourceRule
from preclint.text.evidence import dtype_format
from preclint.text.index import descendants, dotted_name

CAST_METHODS = {"half": "float16", "bfloat16": "bfloat16"}


class LowPrecisionOptimizer(SourceRule):
    code = "PCL507"
    name = "low-precision-optimizer"
    summary = "A model cast with `.half()`/`.bfloat16()`/`.to(torch.float16|bfloat16)` has its parameters handed to a torch.optim optimizer."
    severity = "warning"
    precisions = ("fp16-full", "bf16-full")
    triggers = (("half", "bfloat16", "float16"), ("optim",))
    why = """
An optimizer updates the parameters it is given in their own dtype and keeps its state in it. After
`model.half()` or `model.to(torch.bfloat16)` an update smaller than half a spacing of the weight is
lost (bfloat16 at lr 1e-4: 99.9% of the updates of a small model, measured by preclint check --train),
Adam's eps=1e-8 is 0 in float16 and its second moments flush, so weights turn inf or NaN. Mixed
precision keeps float32 master weights: the model stays float32 and autocast runs the arithmetic in the
low dtype. Nothing is run: the rule reads the file.
"""
    example = """
model = Net().half()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
"""
    fix = """
Keep the model in float32 and train under `torch.autocast` (with a GradScaler for float16), so the
optimizer updates float32 master weights; or keep a float32 copy of the parameters that the optimizer
updates and copy it into the low-precision model after each step.
"""
    valid = (
        """
import torch

model = Net()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
""",
        """
import copy
import torch

model = Net()
opt = torch.optim.AdamW(model.parameters())
inference = copy.deepcopy(model).half()
""",
    )
    invalid = (
        """
import torch

model = Net().half()
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
""",
        """
import torch
from torch import optim

model = Net()
model.to(torch.bfloat16)
opt = optim.SGD(model.parameters(), lr=1e-4)
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        index = source.index
        cast: Dict[str, str] = {}  # name -> the dtype it was cast to
        for site in index.calls:
            dtype = _cast_dtype(site, index)
            if dtype is None:
                continue
            receiver = dotted_name(site.node.func.value) if isinstance(site.node.func, cst.Attribute) else None
            if receiver:
                cast[receiver] = dtype
        for assign in index.assigns:  # model = Net().half()
            value = assign.value
            if isinstance(value, cst.Call):
                calls = [site for site in index.calls if site.node is value]
                if calls and _cast_dtype(calls[0], index) is not None:
                    cast[assign.dotted] = _cast_dtype(calls[0], index)
        if not cast:
            return
        for site in index.calls:
            qualified = index.qualify(site.dotted, site) or ""
            if not qualified.startswith("torch.optim.") or not qualified.split(".")[-1][:1].isupper():
                continue
            for node in descendants(site.node):
                if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) \
                        and node.func.attr.value in ("parameters", "named_parameters"):
                    owner = dotted_name(node.func.value)
                    if owner in cast:
                        yield source.report(
                            self, site.node, f"`{owner}` is cast to {cast[owner]} and its parameters go to "
                            f"`{qualified}`: updates under half a {cast[owner]} spacing are lost and the optimizer's "
                            "state is kept in it.",
                            "Keep float32 master weights: train the float32 model under torch.autocast.",
                            precisions=("fp16-full",) if cast[owner] == "float16" else ("bf16-full",))
                        break


def _cast_dtype(site, index) -> Optional[str]:
    if site.method in CAST_METHODS and not site.node.args:
        return CAST_METHODS[site.method]
    if site.method == "to":
        for arg in site.node.args:
            if arg.keyword is None or arg.keyword.value == "dtype":
                fmt = dtype_format(arg.value, index, site)
                if fmt is not None:
                    return "float16" if fmt is FP16 else "bfloat16"
    return None
