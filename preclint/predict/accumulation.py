"""How a kernel accumulates: the terms a dot product or sum adds up, and the error a reduction, scan or
float16 GEMM adds by keeping its partial results in a reduced format."""
from __future__ import annotations

import math
from typing import Dict, Optional

from preclint.core.ir import DOT_PRODUCT_KINDS, Node
from preclint.core.numerics import C_OUTPUT, FORMATS
from preclint.reference.analyses.contraction import Contraction
from preclint.reference.analyses.terms import Terms


def contraction(node: Node) -> Contraction:
    """How the dot product accumulates (a plain sum where the reference pass did not say)."""
    return node.record(Contraction) or Contraction()


def terms_rms(node: Node) -> Optional[float]:
    """The RMS of the terms a dot product or sum adds up, where the reference pass measured it."""
    terms = node.record(Terms)
    return terms.rms if terms is not None else None


# How CUDA kernels accumulate sums, products and scans of float16/bfloat16 inputs: (a, p) of an
# accumulation error of a * u * n**p (relative RMS) over a length n; absent means float32
# accumulation, whose only error is rounding the result. Measured on an H200 with torch 2.11
# (benchmarks/accuracy.py measure --accumulation, h200.json in benchmarks/CLAIMS.md): sum, mean and prod
# accumulate in float32 at every length; cumsum carries its running sum in the reduced format between
# blocks, fitted over n = 256 ... 65536 within 1.5x (positive terms over 10^6 stagnate, 10x more);
# cumprod keeps its running product in the reduced format, which rounds at every step: sqrt(n/3) u,
# more when the factors lie within a few u of 1 (then products stagnate).
LOW_PRECISION_ACCUMULATION: Dict[str, tuple] = {"cumsum": (0.163, 0.37), "cumprod": (1 / math.sqrt(3.0), 0.5)}
# float16 GEMMs with torch.backends.cuda.matmul.allow_fp16_accumulation = True, same form over the
# reduction length K (H200, K = 64 ... 16384: 0.66, 1.33, 2.62 u in all against 0.43 u without).
FP16_GEMM_ACCUMULATION = (0.15, 0.29)
PRODUCTS = frozenset({"prod", "cumprod"})
# float32's own accumulation (the fp32 mode, against float64), relative to the terms: a kernel that
# adds a dot product's n terms one after another (fused multiply-adds) rounds each partial sum, of
# RMS sqrt(j) terms at step j, by C_OUTPUT * u: C_OUTPUT / sqrt(2) * u * sqrt(n) in all. Measured on
# the CPU (torch 2.14, benchmarks/results/float32_floor_cpu.json): direct 3x3 convolutions 0.99x the
# law at n = 576 ... 4608; blocked GEMMs add partial sums of blocks and err less (2.4 u at n = 64 to
# 5.0 u at 16384: 1.0x to 0.13x the law). Reductions other than dot products (sum, mean, softmax) add
# pairwise or in blocks on the CPU and the GPU: their error is the result's rounding.
FLOAT32_ACCUMULATION = (C_OUTPUT / math.sqrt(2.0), 0.5)


def accumulation_error(node: Node, fmt: str) -> float:
    """Relative RMS error that the kernel of a reduction or scan of length n adds in ``fmt`` by keeping
    its partial results there, beyond rounding its result; 0 where it accumulates in float32. (The
    rounding of a product's n factors compounds as sqrt(n) of theirs: the gradients carry that.)"""
    if node.kind in DOT_PRODUCT_KINDS:
        law = FP16_GEMM_ACCUMULATION if contraction(node).fp16_accumulation and fmt == "fp16" else None
    else:
        law = LOW_PRECISION_ACCUMULATION.get(node.fn)
    if law is None or fmt not in ("fp16", "bf16"):
        return 0.0
    n = node.reduction_length or 1
    return law[0] * FORMATS[fmt].unit_roundoff * n ** law[1]


def float32_accumulation(node: Node) -> float:
    """Relative RMS error, against its terms, of a dot product accumulated in float32 (FLOAT32_ACCUMULATION):
    what the other modes take as exact, and the fp32 mode's whole error of a conv, linear or matmul."""
    if node.kind not in DOT_PRODUCT_KINDS or not contraction(node).contracts:
        return 0.0
    n = node.reduction_length or 1
    return FLOAT32_ACCUMULATION[0] * FORMATS["fp32"].unit_roundoff * n ** FLOAT32_ACCUMULATION[1]
