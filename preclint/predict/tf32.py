"""TF32: which dot products the backend runs on TF32 tensor cores, the only ones TF32 rounds.

The assumption is core/kernels.py's, shared with the CPU emulation: TF32 wherever the backend may
take it (the headline), float32 where it was measured not to; ``BACKEND`` kernels, whose choice is
cuDNN's or cuBLAS's, are also predicted in float32 for the second figure (``float32_backend``).
"""
from __future__ import annotations

import math

from preclint.core.ir import Kind, Node
from preclint.core.kernels import BACKEND, FLOAT32, TF32, conv_kernel, product_kernel
from preclint.predict.accumulation import contraction


def tf32_kernel(node: Node) -> str:
    """The kernel class (core/kernels.py) of a dot product under TF32, from the shapes the check
    recorded. An einsum that contracts nothing is an elementwise product (FLOAT32)."""
    if not contraction(node).contracts:
        return FLOAT32
    out = node.out
    shape = out.shape if out is not None else ()
    if node.kind == Kind.CONV and len(shape) >= 3:
        rows = out.numel // max(1, shape[1])  # batch x output positions
        groups = node.groups or 1
        in_channels = node.attrs.get("in_channels")
        if in_channels is None and len(node.input_stats) > 0 and node.input_stats[0] is not None:
            in_channels = node.input_stats[0].shape[1] if len(node.input_stats[0].shape) > 1 else None
        out_channels = node.attrs.get("out_channels") or shape[1]
        kernel = node.attrs.get("kernel_size") or ()
        return conv_kernel(in_channels // groups if in_channels is not None else None, groups,
                           math.prod(kernel) if kernel else 1, rows, out_channels // groups)
    reduction = node.reduction_length
    if node.kind == Kind.LINEAR and shape:
        return product_kernel(out.numel // max(1, shape[-1]), shape[-1], reduction)
    if node.kind == Kind.MATMUL and len(shape) >= 2 and node.fn in ("matmul", "mm", "bmm", "baddbmm"):
        return product_kernel(shape[-2], shape[-1], reduction)
    stats = node.input_stats
    if node.fn == "scaled_dot_product_attention" and len(stats) >= 2 and stats[0] is not None and stats[1] is not None \
            and len(stats[0].shape) >= 2 and len(stats[1].shape) >= 2:
        # the scores' product: queries x keys over the head dimension (a decode step's one query is a
        # single row, as the emulation reads it: measure/modes.py)
        return product_kernel(stats[0].shape[-2], stats[1].shape[-2], stats[0].shape[-1])
    return TF32


def tensor_core_tf32(node: Node, float32_backend: bool = False) -> bool:
    """Whether the prediction rounds the dot product's operands to TF32: for every kernel that may take
    TF32, or with ``float32_backend`` only for those measured to (the backend's choices in float32)."""
    kernel = tf32_kernel(node)
    return kernel == TF32 or (kernel == BACKEND and not float32_backend)
