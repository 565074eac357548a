"""How a dot product accumulates: whether an einsum sums at all, and whether the model's code let
cuBLAS accumulate float16 products in float16 (torch.backends.cuda.matmul.allow_fp16_accumulation)."""
from __future__ import annotations

from dataclasses import dataclass

from preclint.reference.analyses import ForwardAnalysis
from preclint.capture.observer import Call
from preclint.core.ir import DOT_PRODUCT_KINDS, Node


@dataclass(frozen=True)
class Contraction:
    """How a dot product accumulates."""

    contracts: bool = True  # False: an einsum that only multiplies (an outer product), no sum to round
    fp16_accumulation: bool = False  # the model's code let cuBLAS accumulate float16 products in float16


class ContractionAnalysis(ForwardAnalysis):
    record = Contraction

    def observe(self, node: Node, call: Call) -> None:
        if node.kind not in DOT_PRODUCT_KINDS:
            return
        args = call.args
        contracts = einsum_contracts(args[0]) if node.fn == "einsum" and args and isinstance(args[0], str) else True
        node.put(Contraction(contracts=contracts, fp16_accumulation=fp16_accumulation()))


def einsum_contracts(equation: str) -> bool:
    """Whether an einsum sums over an index (a matmul) or only multiplies (an outer product)."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    letters = [c for c in inputs if c.isalpha()]
    if not arrow:  # implicit output: the indices that appear once
        output = "".join(c for c in set(letters) if letters.count(c) == 1)
    return bool(set(letters) - set(output))


def fp16_accumulation() -> bool:
    """torch.backends.cuda.matmul.allow_fp16_accumulation, as the model's code left it (torch >= 2.7)."""
    import torch

    return bool(getattr(torch.backends.cuda.matmul, "allow_fp16_accumulation", False))
