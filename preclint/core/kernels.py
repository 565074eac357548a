"""Which kernel a float32 dot product gets when TF32 is allowed: the one assumption that both the
prediction (predict/tf32.py) and the CPU emulation of TF32 (measure/modes.py) make, so that the two
can never disagree about a layer.

``torch.backends.cudnn.allow_tf32`` and ``torch.backends.cuda.matmul.allow_tf32`` *allow* TF32 tensor
cores; cuDNN and cuBLAS still choose each kernel by their own heuristics, so a shape falls in one of
three classes:

* ``TF32``: kernels measured to take TF32 (dense convolutions of torchvision's and timm's models
  on an H200 with cuDNN 9: K = C_in/groups * kernel >= 512 over many output positions; GEMMs of
  m >= 16 rows and min(n, k) >= 512, the bound PyTorch's Inductor derived from cuBLAS's choices on
  an H100, pytorch/pytorch#183355);
* ``FLOAT32``: kernels measured not to (depthwise convolutions and convolutions reading 4 or fewer
  channels per group, an RGB stem or a patch embedding, on CUDA cores; products with a single row
  or column, which BLAS computes as matrix-vector products);
* ``BACKEND``: everything smaller, where the choice is the backend's and changes with the library
  version, the batch size and ``cudnn.benchmark`` (a training script's 32-channel convs and batch-8
  linears ran in float32 on an H200).

The headline TF32 prediction assumes TF32 wherever it is allowed and may be taken (``TF32`` and
``BACKEND``): it is the error a tolerance must allow for, since a later library or another batch
size may pick the TF32 kernel. Where ``BACKEND`` kernels hold error, the prediction also gives the
figure with those kernels in float32 (what small models often measure).
"""
from __future__ import annotations

from typing import Optional

TF32 = "tf32"
FLOAT32 = "float32"
BACKEND = "backend"

# the reduction length and the rows above which cuDNN and cuBLAS were seen to take TF32 kernels
LARGE_REDUCTION = 512
MANY_ROWS = 16


def conv_kernel(per_group: Optional[int], groups: int, kernel_numel: int, rows: Optional[int],
                out_per_group: Optional[int] = None) -> str:
    """The class of a convolution's kernel. ``per_group``: input channels per group; ``rows``: output
    positions times batch (the implicit GEMM's rows); ``out_per_group``: output channels per group."""
    if per_group is not None and ((groups > 1 and per_group == 1) or per_group <= 4):
        return FLOAT32
    if rows == 1 or out_per_group == 1:
        return FLOAT32
    reduction = (per_group or 0) * kernel_numel
    if per_group is not None and reduction >= LARGE_REDUCTION and (rows is None or rows >= MANY_ROWS):
        return TF32
    return BACKEND


def product_kernel(rows: Optional[int], cols: Optional[int], reduction: Optional[int]) -> str:
    """The class of a linear layer's or a matmul's kernel (rows x reduction times reduction x cols)."""
    if rows == 1 or cols == 1:
        return FLOAT32
    if rows is None or cols is None or reduction is None:
        return TF32  # shape unknown: allowed, so assumed taken
    if rows >= MANY_ROWS and min(cols, reduction) >= LARGE_REDUCTION:
        return TF32
    return BACKEND


def describe(kernel: str) -> str:
    return {TF32: "TF32 tensor cores", FLOAT32: "a float32 kernel", BACKEND: "the backend's choice"}[kernel]
