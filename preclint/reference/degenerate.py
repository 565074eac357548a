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
            residue = _residue(graph, graph.get(name))
            if residue is not None:
                found.append(residue)
    return found


# ops whose result is as exact, relative to itself, as their operands: a product is residue only where
# an operand is (x * 1e-21 of a value of 1e20 is 0.1, and no residue), so they are looked through
MULTIPLICATIVE = frozenset({"mul", "div", "neg", "reciprocal"})


def _residue(graph: Graph, node, depth: int = 0) -> Optional[DegenerateOutput]:
    """``node``'s value as a DegenerateOutput where it is all zero or rounding residue, else None."""
    while node is not None and node.kind == Kind.SHAPE and node.inputs:  # a reshape or getitem of it
        node = graph.get(node.inputs[0])
    stats = node.out if node is not None else None
    if stats is None or not stats.is_float or not stats.finite or stats.numel == 0:
        return None
    if stats.rms == 0:
        return DegenerateOutput(node.name, 0.0, 0.0)
    if node.fn in MULTIPLICATIVE and depth < 16:
        for name in node.inputs:
            operand = graph.get(name)
            if operand is not None and operand.kind not in (Kind.INPUT, Kind.CONSTANT):
                found = _residue(graph, operand, depth + 1)
                if found is not None:
                    return found
        return None
    terms = node.record(Terms)
    if node.kind in DOT_PRODUCT_KINDS and terms is not None:
        feeding = terms.rms  # sqrt(sum (a b)^2): what float32 resolves the sum to a fraction of
    else:
        feeding = max([s.rms for s in node.input_stats if s is not None and s.is_float and s.finite] + [0.0])
    if stats.rms < DEGENERATE_RATIO * feeding:
        return DegenerateOutput(node.name, stats.rms, feeding)
    return None


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



# Activations that shrink or grow by this factor between two dot products of the network: a trained
# network keeps its activations within a few orders of magnitude (its normalisations are fitted), so
# such a drift is the initialisation's (BatchNorm at its default statistics in YOLOv8: 0.17 -> 5e-10;
# random-init ResNet-101: 1e5), and the figures that follow from it describe the weights, not the model.
DRIFT = 1e4
MIN_LAYERS = 6
STEP = 100.0
# a value this far into the drift is one the drift made (findings about it are marked)
DRIFTED = 1e3


@dataclass
class ScaleDrift:
    kind: str  # "vanishing" or "exploding"
    start: str  # the node with the larger (vanishing) or smaller (exploding) RMS, before ``end``
    start_rms: float
    end: str
    end_rms: float

    @property
    def factor(self) -> float:
        return max(self.start_rms, self.end_rms) / min(self.start_rms, self.end_rms)

    def drifted(self, rms: float) -> bool:
        """Whether a value of this RMS lies in the range the drift made."""
        if self.kind == "vanishing":
            return 0 < rms <= self.start_rms / DRIFTED
        return rms >= self.start_rms * DRIFTED

    def describe(self, display) -> str:
        way = "shrink" if self.kind == "vanishing" else "grow"
        return (f"activations {way} by {self.factor:.0e} over the network, from RMS {sci(self.start_rms)} at "
                f"{display(self.start)} to {sci(self.end_rms)} at {display(self.end)}")


def scale_drift(graph: Graph) -> Optional[ScaleDrift]:
    """The largest shrink (else growth) of the RMS of the dot products' results along the network, where
    it reaches DRIFT and builds up layer by layer, as an initialisation compounds (over MIN_LAYERS dot
    products at least, none of them changing the scale STEP-fold or more: a deliberate rescaling, a
    `* 1e6`, is the model's); None otherwise or without a reference pass."""
    if not graph.ran_reference:
        return None
    values = [(n.name, n.out.rms) for n in graph.nodes
              if n.kind in DOT_PRODUCT_KINDS and n.out is not None and n.out.is_float and n.out.finite
              and n.out.numel > 1 and n.out.rms > 0]
    steps = [max(a / b, b / a) for (_, a), (_, b) in zip(values, values[1:])]
    if len(values) < MIN_LAYERS or (steps and max(steps) >= STEP):
        return None
    shrink = grow = None
    high = low = None
    for name, rms in values:
        if high is not None and (shrink is None or high[1] / rms > shrink[1] / shrink[3]):
            shrink = (high[0], high[1], name, rms)
        if low is not None and (grow is None or rms / low[1] > grow[3] / grow[1]):
            grow = (low[0], low[1], name, rms)
        high = (name, rms) if high is None or rms > high[1] else high
        low = (name, rms) if low is None or rms < low[1] else low
    if shrink is not None and shrink[1] / shrink[3] >= DRIFT:
        return ScaleDrift("vanishing", *shrink)
    if grow is not None and grow[3] / grow[1] >= DRIFT:
        return ScaleDrift("exploding", *grow)
    return None


def drift_note(drift: ScaleDrift, display) -> str:
    return (f"these weights are a poor stand-in for a trained model: {drift.describe(display)}. Random "
            "initialisation does this (BatchNorm at its default statistics, unscaled residual branches); trained "
            "weights keep activations within a few orders of magnitude. Findings about values in that range are "
            "marked as describing these weights; if they are not the trained ones, pass those with --weights FILE "
            "(a state dict) for figures that hold for the model.")


def mark_drifted(findings, graph: Graph, drift: Optional[ScaleDrift], codes_by_drift) -> None:
    """Say so in the findings that describe only the drift: underflow where activations vanished,
    overflow where they exploded (``codes_by_drift``: "vanishing"/"exploding" -> the codes of the rules
    about values too small / too large, from their ``size_drift``)."""
    if drift is None:
        return
    for f in findings:
        node = graph.get(f.node) if f.node else None
        if f.code in codes_by_drift.get(drift.kind, ()) and node is not None and node.out is not None and drift.drifted(node.out.rms):
            f.message += (f" This likely describes these weights rather than the model: the network's activations "
                          f"{'shrink' if drift.kind == 'vanishing' else 'grow'} {drift.factor:.0e}-fold with them "
                          "(see the warning); with trained weights it may not occur.")


# Outputs this far below the model's inputs (RMS against RMS): a trained network's outputs keep the
# scale its task gives them (logits of order 1, features near its inputs'), and random-init ones land
# within 1e-2 of the inputs (torchvision's resnet18 0.55, regnet_y_400mf 0.02, resnext50 0.04), but an
# initialisation that scales residual branches or the head down (timm's FastViT 4e-4 with layer scale
# 1e-5, EVA's head_init_scale 1e-3) leaves outputs near zero. Their relative errors still hold; their
# absolute errors, the atol a comparison needs and the range findings describe the initialisation.
NEAR_ZERO = 1e-3


@dataclass
class NearZeroOutput:
    node: str  # the node that produces the output
    rms: float
    input_rms: float  # RMS of the model's float inputs (else of its embedding lookups)

    @property
    def ratio(self) -> float:
        return self.rms / self.input_rms

    def describe(self, display) -> str:
        return (f"{display(self.node)} has RMS {sci(self.rms)}, {self.ratio:.1e} times the inputs' "
                f"(RMS {sci(self.input_rms)})")


def _input_rms(graph: Graph) -> float:
    """RMS of the model's float inputs, else of what its embedding lookups return (token ids are not values)."""
    inputs = [n.out for n in graph.nodes if n.kind == Kind.INPUT and n.fn == "input" and n.out is not None]
    floats = [s for s in inputs if s.is_float and s.finite and s.numel > 0]
    if not floats:
        floats = [n.out for n in graph.nodes if n.fn == "embedding" and n.out is not None and n.out.is_float
                  and n.out.finite and n.out.numel > 0]
    total = sum(s.numel for s in floats)
    return (sum(s.rms ** 2 * s.numel for s in floats) / total) ** 0.5 if total else 0.0


def near_zero_outputs(graph: Graph) -> List[NearZeroOutput]:
    """The float outputs (of more than one element) whose RMS is below NEAR_ZERO times the inputs'
    but not degenerate (degenerate_outputs says those): outputs a random initialisation left near
    zero. Empty without a reference pass or float inputs to compare with."""
    if not graph.ran_reference:
        return []
    scale = _input_rms(graph)
    if scale <= 0:
        return []
    degenerate = {d.node for d in degenerate_outputs(graph)}
    found = []
    for output in graph.output_nodes:
        for name in output.inputs:
            node = graph.get(name)
            while node is not None and node.kind == Kind.SHAPE and node.inputs:
                node = graph.get(node.inputs[0])
            stats = node.out if node is not None else None
            if (stats is None or not stats.is_float or not stats.finite or stats.numel < 2 or stats.rms == 0
                    or node.name in degenerate or node.kind == Kind.INPUT):
                continue
            if stats.rms < NEAR_ZERO * scale:
                found.append(NearZeroOutput(node.name, stats.rms, scale))
    return found


def near_zero_note(found: Sequence[NearZeroOutput], display) -> str:
    what = "; ".join(d.describe(display) for d in found)
    return (f"these weights are a poor stand-in for a trained model: the output is near zero ({what}). An "
            "initialisation that scales residual branches or the head down does this; trained weights give outputs "
            "the scale of their task. Relative errors still hold, but absolute errors, the atol a comparison needs "
            "and range findings describe these weights; if they are not the trained ones, pass those with "
            "--weights FILE (a state dict).")
