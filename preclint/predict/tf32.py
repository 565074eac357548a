"""TF32: which dot products the backend runs on TF32 tensor cores, the only ones TF32 rounds."""
from __future__ import annotations

from preclint.core.ir import Kind, Node
from preclint.predict.accumulation import contraction


def tensor_core_tf32(node: Node) -> bool:
    """Whether the backend runs the dot product on TF32 tensor cores when TF32 is on. On an H200
    (torch 2.11, cuBLAS, cuDNN 9.19; probe_h200_agree.json in benchmarks/CLAIMS.md) these ran in plain fp32 instead:
    products with a single row (matrix-vector: cuBLAS gemv; a classifier on one image, an SE block's
    1x1 convs on pooled features), depthwise convs, and convs that read fewer than 4 channels per
    group (an RGB stem, a patch embedding). An einsum that contracts nothing is an elementwise
    product. Other shapes are left to the backend's heuristics, which the probe measures."""
    if not contraction(node).contracts:
        return False
    out = node.out
    shape = out.shape if out is not None else ()
    if node.kind == Kind.CONV and len(shape) >= 3:
        rows = out.numel // max(1, shape[1])  # batch x output positions
        in_channels = node.attrs.get("in_channels")
        groups = node.groups or 1
        if in_channels is None and len(node.input_stats) > 0 and node.input_stats[0] is not None:
            in_channels = node.input_stats[0].shape[1] if len(node.input_stats[0].shape) > 1 else None
        if in_channels is not None and (in_channels // groups < 4 or (groups > 1 and groups == in_channels)):
            return False
        return rows > 1
    if node.kind == Kind.LINEAR and shape:
        return out.numel // max(1, shape[-1]) > 1
    if node.kind == Kind.MATMUL and len(shape) >= 2 and node.fn in ("matmul", "mm", "bmm", "baddbmm"):
        return shape[-2] > 1 and shape[-1] > 1
    return True
