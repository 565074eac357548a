"""The atol a plan meets when only --rtol is given.

A tolerance of rtol alone (atol = 0) fails every element that is 0 in the reference, and the elements
near 0, which sums cancel into, carry relative errors far above the format's u whatever is kept: a
conv or matmul's output that crosses 0 has elements 1000x smaller than its RMS. So no plan met it on
ordinary models, and `plan --rtol 1e-2` was refused. The default judges those elements at the scale of
the output instead: atol = rtol x RMS(output of the float32 reference), the atol of
``torch.testing.assert_close`` style comparisons scaled to the values compared.
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Optional, Tuple

from preclint.core.findings import sci
from preclint.core.ir import Graph


def output_rms(graph: Graph) -> Optional[float]:
    """The RMS over every float output the reference pass recorded (None without one)."""
    values = [s for node in graph.output_nodes
              for s in (node.outputs or [t for n in node.inputs for t in graph[n].outputs[:1]])
              if s is not None and s.is_float and s.finite and s.numel]
    numel = sum(s.numel for s in values)
    if not graph.ran_reference or not numel:
        return None
    return math.sqrt(sum(s.rms**2 * s.numel for s in values) / numel)


def with_default_atol(graph: Graph, tolerance) -> Tuple[object, Optional[str]]:
    """(the tolerance, a note) with atol = rtol x RMS(output) where rtol is given and atol is not."""
    if tolerance.rtol is None or tolerance.atol is not None:
        return tolerance, None
    rms = output_rms(graph)
    if not rms:
        return tolerance, None
    atol = float(f"{tolerance.rtol * rms:.2g}")
    note = (f"atol defaults to rtol x RMS of the float32 output = {sci(tolerance.rtol)} x {sci(rms)} = {sci(atol)}, "
            "so elements near 0 are judged at the output's scale (with atol 0 every element that cancels to about "
            "0 fails at any precision); pass --atol to choose another")
    return replace(tolerance, atol=atol), note
