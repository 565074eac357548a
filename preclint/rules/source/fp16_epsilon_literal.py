"""PCL505 fp16-epsilon-literal: an epsilon that float16 rounds to zero (or to a subnormal)."""
from __future__ import annotations

import functools
import re
from typing import Iterator

import libcst as cst

from preclint.core.findings import Finding
from preclint.core.numerics import FP16, representable, round_to
from preclint.rules.base import SourceRule
from preclint.text.args import code, keyword
from preclint.text.evidence import AUTOCAST, CAST
from preclint.text.index import number

# eps consumers, by the last part of their qualified name
OPTIMIZERS = {
    "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "NAdam", "RAdam", "SparseAdam", "Adafactor",
}
# composite functions that compute ``x / max(norm, eps)`` in the input's dtype; under autocast they
# run in fp32 (autocast's fp32 list), so they need a cast to fp16
COMPOSITES = {"normalize", "cosine_similarity", "pairwise_distance", "rms_norm", "RMSNorm"}
# normalisation layers whose PyTorch kernels add eps in fp32 even for fp16 inputs: only exported
# fp16 engines (ONNX, TensorRT) store eps as an fp16 constant
FUSED_NORMS = {
    "LayerNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d", "InstanceNorm2d",
    "InstanceNorm3d", "layer_norm", "group_norm", "batch_norm", "instance_norm", "SyncBatchNorm",
}
GUARD_FUNCTIONS = {"clamp", "clamp_min", "clip"}
GUARDED_CALLS = {"sqrt", "rsqrt", "log", "log2", "log10", "reciprocal", "div", "true_divide"}


def _stored(value: float) -> str:
    return f"{round_to(value, FP16):.3g}"


class Fp16EpsilonLiteral(SourceRule):
    code = "PCL505"
    name = "fp16-epsilon-literal"
    summary = "An epsilon that float16 cannot hold: it rounds to 0 (below 3e-8) or to a subnormal."
    severity = "warning"
    precisions = ("fp16", "fp16-full")
    # a literal fp16 cannot hold (below 6.1e-5: an exponent of -5 or less, 0.0000x, 2 ** -15 or
    # less), and a sign of fp16; an epsilon named in the file is assigned such a literal there
    triggers = (
        (re.compile(r"[0-9.][eE]-0*(?:[5-9]|[1-9][0-9])|\.0000|\*\*\s*-\s*(?:1[5-9]|[2-9][0-9])"),),
        ("half", "float16", "autocast", "fp16", "FP16"),
    )
    why = """
float16's smallest subnormal is 6.0e-8 and its smallest normal 6.1e-5. An epsilon of 1e-8 or 1e-12
that guards a division becomes exactly 0 once it meets an fp16 tensor (`x / (n + 1e-8)`, `n.clamp(min=1e-12)`,
`F.normalize(x, eps=1e-12)` on fp16 values), and the division it guards returns inf or NaN on the first
zero. Optimizer epsilons matter once parameters are fp16 (`model.half()`): Adam adds eps to
`sqrt(v)` in the parameters' dtype, so eps=1e-8 is lost and a zero second moment divides by zero; a
subnormal eps (below 6.1e-5) keeps only a few bits and is flushed to zero by kernels that flush
subnormals. The rule fires only in files that show fp16: `.half()`, `torch.float16`, an fp16 autocast.
Under autocast alone, division guards still count (elementwise ops run in their inputs' dtype, fp16
after a matmul), but normalize-style functions and optimizers do not (autocast runs the former in
fp32 and leaves parameters in fp32). LayerNorm/GroupNorm/BatchNorm kernels add eps in fp32 even for
fp16 inputs; their epsilons are reported as info, for fp16 engines exported from the model.
"""
    example = """
model = model.half()
y = x / (x.norm(dim=-1, keepdim=True) + 1e-8)
opt = torch.optim.Adam(model.parameters(), eps=1e-8)
"""
    fix = """
Use an epsilon fp16 can hold where the arithmetic runs in fp16: 1e-6 for a guard that only needs to
be nonzero (stored as 1.01e-6), 1e-4 or more where it must stay a normal number (optimizer eps with
fp16 parameters; better, keep fp32 master parameters with autocast and a GradScaler). Or compute
the guarded expression in fp32 (`x.float()`).
"""
    valid = (
        """
import torch

model = model.half()
y = x / (x.norm(dim=-1, keepdim=True) + 1e-4)
""",
        """
import torch

y = x / (x.norm() + 1e-8)
opt = torch.optim.Adam(params, eps=1e-8)
""",
        """
import torch

with torch.autocast("cuda", dtype=torch.bfloat16):
    y = x / (x.norm() + 1e-8)
""",
        """
import torch

with torch.autocast("cuda"):
    y = model(x)
opt = torch.optim.AdamW(model.parameters(), eps=1e-8)
""",
    )
    invalid = (
        """
import torch

model = model.half()
y = x / (x.norm(dim=-1, keepdim=True) + 1e-8)
""",
        """
import torch

model = Net().to(torch.float16)
opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
""",
        """
import torch
import torch.nn.functional as F

EPS = 1e-12

def embed(x):
    return F.normalize(x.half(), dim=-1, eps=EPS)
""",
        """
import torch

with torch.autocast("cuda", dtype=torch.float16):
    scale = weight / weight.abs().amax().clamp(min=1e-10)
""",
    )

    def check_source(self, source) -> Iterator[Finding]:
        evidence = [e for e in source.evidence.everywhere() if e.fmt is FP16 and e.kind in (CAST, AUTOCAST)]
        if not evidence:
            return
        cast = [e for e in evidence if e.kind == CAST]

        @functools.lru_cache(maxsize=None)
        def where() -> str:  # positions are computed only for a file with something to report
            shown = min(cast or evidence, key=lambda e: source.location(e.node))
            return f"fp16 shown by `{shown.text}` at line {source.location(shown.node).line}"

        index = source.index
        constants = index.constants

        for site in index.calls:
            call = site.node
            qualified = index.qualify(site.dotted, site) or site.dotted or ""
            last = qualified.rsplit(".", 1)[-1] or (site.method or "")
            eps_node = keyword(call, "eps")
            eps = number(eps_node, constants) if eps_node is not None else None
            if eps is not None and eps > 0:
                kind = representable(eps, FP16)
                if last in OPTIMIZERS and cast and kind in ("zero", "subnormal"):
                    yield self._report(source, eps_node, eps, kind, f"the eps of `{last}` with fp16 parameters", where)
                elif last in COMPOSITES and cast and kind == "zero":
                    yield self._report(source, eps_node, eps, kind, f"the eps of `{last}` on fp16 values", where)
                elif last in FUSED_NORMS and cast and kind == "zero":
                    yield source.report(
                        self, eps_node,
                        f"eps={code(eps_node)} of `{last}` is 0 in float16: PyTorch's kernel adds it in fp32, "
                        "but an fp16 engine exported from this model stores it as 0.",
                        f"Use eps >= 1e-5 if the model is exported to fp16 (ONNX, TensorRT); {where()}.",
                        severity="info",
                    )
            if (site.method or last) in GUARD_FUNCTIONS:
                bound = keyword(call, "min")
                if bound is None and site.method == "clamp_min" and call.args:
                    bound = call.args[0].value
                if bound is None and site.method is None and len(call.args) >= 2 and call.args[1].keyword is None:
                    bound = call.args[1].value  # torch.clamp(x, 1e-8)
                if bound is None and site.method in ("clamp", "clip") and call.args and call.args[0].keyword is None:
                    bound = call.args[0].value  # x.clamp(1e-8)
                value = number(bound, constants) if bound is not None else None
                if value is not None and value > 0 and representable(value, FP16) == "zero":
                    yield self._report(source, bound, value, "zero", "the lower bound of a clamp", where)

        # additive guards: ``a / (b + eps)``, ``torch.sqrt(v + eps)``, ``(v + eps).rsqrt()``
        guarded = []
        for site in index.binops:
            if isinstance(site.node.operator, cst.Divide):
                guarded.append(site.node.right)
        for site in index.calls:
            last = (index.qualify(site.dotted, site) or site.dotted or "").rsplit(".", 1)[-1]
            if site.method in GUARDED_CALLS and isinstance(site.node.func, cst.Attribute) and not site.node.args:
                guarded.append(site.node.func.value)  # (v + eps).sqrt()
            elif (last in GUARDED_CALLS or site.method in GUARDED_CALLS) and site.node.args:
                guarded.append(site.node.args[0].value)  # torch.sqrt(v + eps)
        for node in guarded:
            if not (isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add)):
                continue
            for operand in (node.left, node.right):
                value = number(operand, constants)
                if value is not None and value > 0 and representable(value, FP16) == "zero":
                    yield self._report(source, operand, value, "zero", "the additive guard", where)

    def _report(self, source, node: cst.CSTNode, value: float, kind: str, what: str, where) -> Finding:
        shown = f"{code(node)} = {value:g}" if isinstance(node, cst.Name) else code(node)
        if kind == "zero":
            message = f"{shown} rounds to 0 in float16: as {what} it guards nothing, and a zero gives inf or NaN."
        else:
            message = (
                f"{shown} is subnormal in float16 (below 6.1e-05): as {what} it is stored as "
                f"{_stored(value)} and lost where kernels flush subnormals to zero."
            )
        return source.report(
            self, node, message,
            f"Use an epsilon float16 holds (1e-6 to stay nonzero, 1e-4 to stay normal), or compute this in "
            f"fp32; {where()}.",
        )
