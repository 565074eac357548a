"""The two cases of a TF32 prediction: the headline assumes TF32 on every kernel that may take it, the
second figure puts the kernels whose choice is the backend's (core/kernels.py) in float32, and a note
says which kernels each assumes."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Dict, Optional

from preclint.core.findings import sci
from preclint.core.ir import DOT_PRODUCT_KINDS, Graph
from preclint.core.kernels import BACKEND, FLOAT32, TF32
from preclint.predict.error_model import ModePrediction, predict_mode
from preclint.predict.tf32 import tf32_kernel

# the second figure is shown where it is below the headline by more than this factor
DIFFERENT = 2.0


@dataclass
class KernelCases:
    counts: Dict[str, int]  # kernel class -> dot products of that class
    float32_backend: Optional[ModePrediction] = None  # the prediction with the backend's choices in float32

    def second_rel_error(self, headline: ModePrediction) -> Optional[float]:
        """The relative error with the backend's kernels in float32, where it differs from the headline."""
        if self.float32_backend is None or headline.rel_error is None:
            return None
        other = self.float32_backend.rel_error
        if other is None or headline.rel_error <= DIFFERENT * other:
            return None
        return other

    def note(self, headline: ModePrediction) -> Optional[str]:
        """What the TF32 figures assume, where it matters: the backend's kernels change the figure, or
        every kernel runs in float32 (a headline of 0); None otherwise."""
        total = sum(self.counts.values())
        if self.second_rel_error(headline) is None and self.counts.get(FLOAT32, 0) < total:
            return None
        fixed = self.counts.get(FLOAT32, 0)
        chosen = self.counts.get(BACKEND, 0)
        text = (f"tf32 assumes TF32 tensor cores on the {total - fixed} of {total} convs and matmuls that may take "
                "them (torch's allow_tf32 allows TF32, and cuDNN and cuBLAS pick each kernel)")
        if fixed:
            text += (f"; {fixed} {'runs a float32 kernel' if fixed == 1 else 'run float32 kernels'} (depthwise convs, convs over <= 4 channels per group, "
                     "single-row products, as measured on an H200)")
        second = self.second_rel_error(headline)
        if chosen and second is not None:
            text += (f"; {chosen} {'is' if chosen == 1 else 'are'} small enough that the backend's heuristics "
                     f"decide (reduction < 512 or fewer than 16 rows): TF32 {sci(headline.rel_error)} if they use TF32 "
                     f"tensor cores, {float32_figure(second)} if they run in float32. The headline is the TF32 case, since another library version, batch "
                     "size or cudnn.benchmark may pick the TF32 kernel; `--probe cuda` measures which ran")
        return text + ". The CPU emulation (--probe cpu) applies TF32 where the headline assumes it."


def float32_figure(rel_error: float) -> str:
    """The float32-kernel case: 0 means the prediction has no TF32 rounding left, only float32's own."""
    return sci(rel_error) if rel_error > 0 else "float32-sized (no TF32 rounding)"


def kernel_cases(graph: Graph, headline: ModePrediction) -> Optional[KernelCases]:
    """The kernel classes of the graph's dot products under tf32, and the prediction with the
    backend's choices in float32 where there are any (None when the mode is not tf32 or there are no
    dot products)."""
    if not headline.mode.kernel_choice_matters:
        return None
    counts = Counter(tf32_kernel(n) for n in graph.nodes if n.kind in DOT_PRODUCT_KINDS and n.out is not None)
    if not counts:
        return None
    cases = KernelCases({k: counts.get(k, 0) for k in (TF32, BACKEND, FLOAT32)})
    if counts.get(BACKEND) and graph.ran_reference:
        cases.float32_backend = predict_mode(graph, replace(headline.mode, backend_float32=True))
    return cases
