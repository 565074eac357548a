"""Outputs that are all zero or rounding residue with the weights given: their relative error is noise
over noise, so a check of them is vacuous, and reports say so instead of printing it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence

from preclint.core.findings import sci
from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind
from preclint.reference.analyses.terms import Terms

# An output whose RMS is below a millionth of the values that produce it (the RMS of sqrt(sum (a b)^2)
# over the terms of the dot product that makes it, else its operands) is rounding residue, not a
# value: float32 itself resolves such a sum only to about u * sqrt(K) of its terms (u = 6e-8,
# sqrt(K) ~ 16 for K ~ 256), so its digits carry nothing, and its relative error compares noise with
# noise (an unrelated output of the same size differs by sqrt(2): the 141% such outputs used to show).
DEGENERATE_RATIO = 1e-6


@dataclass
class DegenerateOutput:
    node: str  # the node that produces the output
    rms: float
    feeding_rms: float  # RMS of the values it is computed from (0 when unknown)

    def describe(self, display) -> str:
        if self.rms == 0:
            return f"{display(self.node)} is all zero"
        return (f"{display(self.node)} has RMS {sci(self.rms)}, under a millionth of the values it is computed "
                f"from (RMS {sci(self.feeding_rms)})")


def degenerate_outputs(graph: Graph) -> List[DegenerateOutput]:
    """The model's float outputs that are all zero or rounding residue (DEGENERATE_RATIO), from the
    reference pass: a zero-initialised head (torchvision's vit_b_16, timm's MLP-Mixer) gives them."""
    found = []
    for output in graph.output_nodes:
        for name in output.inputs:
            node = graph.get(name)
            while node is not None and node.kind == Kind.SHAPE and node.inputs:  # a reshape or getitem of it
                node = graph.get(node.inputs[0])
            stats = node.out if node is not None else None
            if stats is None or not stats.is_float or not stats.finite or stats.numel == 0:
                continue
            terms = node.record(Terms)
            if node.kind in DOT_PRODUCT_KINDS and terms is not None:
                feeding = terms.rms  # sqrt(sum (a b)^2): what float32 resolves the sum to a fraction of
            else:
                feeding = max([s.rms for s in node.input_stats if s is not None and s.is_float and s.finite] + [0.0])
            if stats.rms == 0 or stats.rms < DEGENERATE_RATIO * feeding:
                found.append(DegenerateOutput(node.name, stats.rms, feeding))
    return found


def all_outputs_degenerate(graph: Graph, found: Optional[Sequence[DegenerateOutput]] = None) -> bool:
    """Whether every float output is degenerate: then no relative error of the output is reported."""
    found = degenerate_outputs(graph) if found is None else found
    floats = sum(1 for output in graph.output_nodes for name in output.inputs
                 if graph.get(name) is not None and graph[name].out is not None and graph[name].out.is_float)
    return bool(found) and len(found) >= floats


def degenerate_note(found: Sequence[DegenerateOutput], display) -> str:
    what = "; ".join(d.describe(display) for d in found)
    return (f"the output is degenerate with these weights ({what}), so the check is vacuous: that output is "
            "zeros or rounding residue at every precision (a zero-initialised head does this). Pass trained "
            "weights with --weights FILE (a state dict); relative errors of such an output are not reported.")

