"""What a batch norm's weights alone tell, without running the model: its folded scale against
float16's range, and how it amplifies the relative error of its input.

Runs under --no-run too, so the batch-norm rule can decide from the checkpoint.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from preclint.reference.analyses import WeightAnalysis
from preclint.core.ir import Graph, Kind

if TYPE_CHECKING:
    import torch


@dataclass
class BatchNormFolding:
    """What a batch norm's weights alone tell: its folded scale gamma / sqrt(var + eps) against float16's
    range, and how it amplifies the relative error of its input."""

    eps: float
    channels: int
    var_min: float
    scale_absmax: float
    amplification: float  # RMS(scale * |x|) / RMS(y) over channels whose inputs are ~ N(mean, var)
    scale_nonfinite: int  # channels, as every count below
    channels_var_zero_in_fp16: int  # running_var + eps is 0 in float16
    channels_var_over_fp16: int  # running_var beyond float16's 65504
    channels_scale_over_fp16: int  # the scale beyond float16's 65504
    folded_weight_absmax: Optional[float] = None  # the conv's weights times the scale, when it folds into one
    folds_into: Optional[str] = None  # that conv's module path


class BatchNormAnalysis(WeightAnalysis):
    record = BatchNormFolding

    def annotate(self, graph: Graph, module: torch.nn.Module) -> None:
        modules = dict(module.named_modules(remove_duplicate=False))  # a shared module under each of its names
        for node in graph.nodes:
            if node.kind == Kind.BATCHNORM and node.module_path in modules:
                folding = fold(graph, node, modules)
                if folding is not None:
                    node.put(folding)


def fold(graph: Graph, node, modules) -> Optional[BatchNormFolding]:
    """The batch norm of ``node`` folded: None where it keeps no running variance."""
    import torch

    bn = modules[node.module_path]
    var = getattr(bn, "running_var", None)
    if not isinstance(var, torch.Tensor):
        return None
    with torch.no_grad():
        var = var.detach().double()
        eps = float(getattr(bn, "eps", 0.0) or 0.0)
        gamma = getattr(bn, "weight", None)
        gamma = gamma.detach().double() if isinstance(gamma, torch.Tensor) else torch.ones_like(var)
        scale = gamma / (var + eps).sqrt()
        mean = getattr(bn, "running_mean", None)
        mean = mean.detach().double() if isinstance(mean, torch.Tensor) else torch.zeros_like(var)
        beta = getattr(bn, "bias", None)
        beta = beta.detach().double() if isinstance(beta, torch.Tensor) else torch.zeros_like(var)
        # How much a relative error of the input (RMS r over channels whose values are ~ N(mean, var))
        # grows relative to the output: r * RMS(scale * |x|) / RMS(y). A dead channel (var ~ 0, mean
        # large) maps a constant input to ~beta, so its rounding error is multiplied by a huge scale.
        signal = (scale.pow(2) * (mean.pow(2) + var)).sum()
        output = (gamma.pow(2) * var / (var + eps) + beta.pow(2)).sum()
        # (an output of 0, zero-initialised gamma and beta, passes no error on; 0 from a nonzero
        # signal is unbounded)
        amplification = float((signal / output).sqrt()) if output > 0 else (0.0 if signal == 0 else float("inf"))
        facts = BatchNormFolding(
            eps=eps,
            channels=int(var.numel()),
            var_min=float(var.min()),
            scale_absmax=float(scale.abs().max()),
            amplification=amplification,
            scale_nonfinite=int((~torch.isfinite(scale)).sum()),
            channels_var_zero_in_fp16=int(((var + eps) < 2.0**-25).sum()),
            channels_var_over_fp16=int((var > 65504).sum()),
            channels_scale_over_fp16=int((scale.abs() > 65504).sum()),
        )
        producer = graph.get(node.inputs[0]) if node.inputs else None
        if producer is not None and producer.kind == Kind.CONV and producer.module_path in modules:
            weight = getattr(modules[producer.module_path], "weight", None)
            if isinstance(weight, torch.Tensor) and weight.shape[0] == scale.numel():
                # (the largest magnitude per channel in the weight's own format: exact, and without a
                # float64 copy of every weight)
                folded = weight.detach().flatten(1).abs().amax(dim=1).double() * scale.abs()
                facts.folded_weight_absmax = float(folded.max())
                facts.folds_into = producer.module_path
    return facts
