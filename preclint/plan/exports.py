"""The plan in the forms a deployment reads: the nodes an ONNX float16 conversion leaves in float32."""
from __future__ import annotations

from typing import List

from preclint.plan.document import Plan
from preclint.policy import Kept, onnx_patterns


def onnx_exclude_patterns(plan: Plan) -> List[str]:
    return onnx_patterns([Kept(k.module, k.op) for k in plan.keep])
