"""The predicted error of each output of a model that returns several (OpenCLIP's image features,
text features and logit scale): one figure per output, each relative to that output's own values.

The whole output's error (error_model.predict_mode) weighs every element alike, and its relative
figure divides by the RMS of all outputs together: a logit scale of 14 beside unit-norm features
made the features' error look five times smaller than it is. Each output's share of that error is
apportioned by the error every value carries forward (``relative_errors``), so that the figures
add up to the whole output's (their element-weighted mean square is its mean square). Where each
output had a backward pass of its own (OutputGains: a model with a few outputs), its figure is the
error the gradients toward it weigh, which an op-by-op apportioning misreads where ops move values
(a cache that passes its input through with one new row).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence

from preclint.core.ir import Graph
from preclint.core.numerics import gaussian_max_factor
from preclint.predict.error_model import ModePrediction, relative_errors
from preclint.reference.analyses.gains import Gains


@dataclass(frozen=True)
class OutputFigure:
    name: str  # the output as the user indexes it: ``output[0]``, ``output['logits']``, ``output.boxes``
    rel_error: Optional[float]  # RMS error relative to this output's RMS; None where not finite
    max_abs_error: Optional[float]
    finite: bool
    error: float = 0.0  # RMS absolute error
    rms: float = 0.0  # RMS of this output's reference values
    numel: int = 0

    def as_dict(self) -> dict:
        return {"output": self.name, "rel_error": self.rel_error, "max_abs_error": self.max_abs_error,
                "finite": self.finite}


def output_producers(graph: Graph, paths: Sequence[str]) -> List[tuple]:
    """(output path, node) of each float tensor the model returns, where the graph tells which
    node made which (one node per tensor returned); [] for one output or where it does not."""
    outputs = graph.output_nodes
    if len(outputs) != 1 or len(paths) < 2:
        return []
    producers = list(outputs[0].inputs)
    if len(producers) != len(paths):  # a tensor returned twice, or one the graph does not name
        return []
    return [(path, graph[name]) for path, name in zip(paths, producers)
            if graph[name].out is not None and graph[name].out.is_float]


def output_figures(graph: Graph, prediction: ModePrediction, paths: Sequence[str]) -> List[OutputFigure]:
    """One figure per float output (``paths``: the tensor leaves of the output, output_leaves'
    paths, in order); [] for a model with one output, or where the graph does not tell them apart."""
    produced = output_producers(graph, paths)
    if len(produced) < 2 or prediction.output_error is None:
        return []
    if not prediction.finite:
        return [OutputFigure(f"output{path}", None, None, False, rms=node.out.rms, numel=node.out.numel)
                for path, node in produced]
    if all(node.name in prediction.output_errors for _, node in produced):
        # each output's own pass (OutputGains): its error as the gradients toward it weigh every rounding
        errors = [prediction.output_errors[node.name] for _, node in produced]
        scale = 1.0
    else:
        forward = relative_errors(graph, prediction, integers_exact=True)
        errors = [(forward.get(node.name) or 0.0) * node.out.rms for _, node in produced]
        numel = sum(node.out.numel for _, node in produced)
        carried = sum(e * e * node.out.numel for e, (_, node) in zip(errors, produced)) / numel if numel else 0.0
        # scaled so that the outputs' errors make the whole output's, which the gradients estimate;
        # without gradients the whole's figure is the largest relative error times the RMS of all
        # outputs together, which a state of -1e30 beside the logits (RWKV's running max) made 1e26
        # times the logits' RMS: each output keeps its own op-by-op figure then
        have_gains = any(n.record(Gains) is not None for n in graph.nodes)
        scale = 1.0 if not have_gains else prediction.output_error / math.sqrt(carried) if carried > 0 else 0.0
    figures = []
    for error, (path, node) in zip(errors, produced):
        absolute = error * scale
        rel = absolute / node.out.rms if node.out.rms > 0 else 0.0
        figures.append(OutputFigure(f"output{path}", rel, absolute * gaussian_max_factor(node.out.numel), True,
                                    absolute, node.out.rms, node.out.numel))
    return figures
