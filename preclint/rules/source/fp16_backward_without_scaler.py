"""PCL506 fp16-backward-without-scaler: a float16 autocast region trained with backward() and no GradScaler."""
from __future__ import annotations

from typing import Iterator

from preclint.core.findings import Finding
from preclint.core.numerics import FP16
from preclint.rules.base import SourceRule
from preclint.text.evidence import autocast_format


class Fp16BackwardWithoutScaler(SourceRule):
    code = "PCL506"
    name = "fp16-backward-without-scaler"
    summary = "float16 autocast with `.backward()` in the same function and no GradScaler in the file."
    severity = "warning"
    precisions = ("fp16",)
    triggers = (("autocast",), ("backward",))
    why = """
Under float16 autocast the gradients of activations and of linear and convolution weights are float16,
which stores nothing below 6e-8. Gradients of a mean loss over a large batch are often that small: they
become 0 and their weights stop learning (preclint check --train measured 11% to 99.9% of the gradient
elements of small regressions flushed). `torch.amp.GradScaler` scales the loss into float16's range and
unscales in float32; bfloat16 autocast needs none. Nothing is run: the rule reads the file.
"""
    example = """
with torch.autocast("cuda", dtype=torch.float16):
    loss = model(x).mean()
loss.backward()
"""
    fix = """
Scale the loss with `scaler = torch.amp.GradScaler("cuda")`: `scaler.scale(loss).backward()`,
`scaler.step(optimizer)`, `scaler.update()`; or use `dtype=torch.bfloat16`.
"""
    valid = (
        """
import torch

scaler = torch.amp.GradScaler("cuda")

def step(model, x, opt):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
""",
        """
import torch

def step(model, x):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x).mean()
    loss.backward()
""",
        """
import torch

def evaluate(model, x):
    with torch.autocast("cuda"):
        return model(x)

def train(model, x):
    model(x).mean().backward()
""",
    )
    invalid = (
        """
import torch

def step(model, x, opt):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(x).mean()
    loss.backward()
    opt.step()
""",
        """
import torch

def step(model, x, opt):
    with torch.cuda.amp.autocast():
        loss = model(x).mean()
    loss.backward()
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        index = source.index
        if any(ref.dotted.split(".")[-1] == "GradScaler" for ref in index.refs):
            return
        backward_scopes = {id(site.scope) for site in index.calls if site.method == "backward"}
        for site in index.calls:
            qualified = index.qualify(site.dotted, site)
            if not qualified:
                continue
            is_autocast, fmt = autocast_format(site.node, qualified, index, site)
            if is_autocast and fmt is FP16 and id(site.scope) in backward_scopes:
                yield source.report(self, site.node,
                                    f"`{qualified}` runs in float16 and its loss is backpropagated with "
                                    "`.backward()` without a GradScaler: gradients under 6e-8 flush to 0.",
                                    "Scale the loss with torch.amp.GradScaler, or autocast to torch.bfloat16.",
                                    precisions=("fp16",))
