"""What a checkpoint's own numbers say: whether its weights are exactly values of a low format (a
checkpoint stored, or trained without float32 master weights, in float16 or bfloat16 is), and the
per-module figures that explain why one checkpoint is more fragile than another (the largest weight,
the batch-norm scales folded into the layer before, the largest running mean).

A float32 value drawn at random is exactly a float16 value about once in 2^13 (its 13 low mantissa
bits all zero) and a bfloat16 one once in 2^16: a fraction near 1 is a fact about how the checkpoint
was made, not chance.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch

# at or above this fraction of its values exactly in a format, a checkpoint is said to be stored in it
STORED_IN = 0.99
LOW_FORMATS = {"fp16": torch.float16, "bf16": torch.bfloat16}
_BATCH_NORMS = ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "FrozenBatchNorm2d", "SyncBatchNorm")


@dataclass
class ModuleWeights:
    """One module's own weights, as the diff explains a layer by them."""

    weight_absmax: Optional[float] = None
    folded_scale: Optional[float] = None  # batch norm: max |gamma / sqrt(running_var + eps)|
    running_mean_absmax: Optional[float] = None

    def as_dict(self) -> Dict[str, Optional[float]]:
        return {k: v for k, v in (("weight_absmax", self.weight_absmax), ("folded_scale", self.folded_scale),
                                  ("running_mean_absmax", self.running_mean_absmax)) if v is not None}


@dataclass
class CheckpointFacts:
    """A checkpoint's floating values against the low formats, and its modules' figures."""

    values: int  # floating elements in the parameters and buffers
    exact: Dict[str, float]  # format -> fraction of those values it represents exactly
    dtypes: Dict[str, int]  # dtype the model holds them in -> elements
    modules: Dict[str, ModuleWeights] = field(default_factory=dict)
    # what no trained checkpoint holds, one phrase per tensor: inf/NaN values, a negative batch-norm
    # running variance (whose square root is NaN)
    invalid: List[str] = field(default_factory=list)

    def stored_in(self) -> Optional[str]:
        """The lowest format that holds the checkpoint's values (nearly) all exactly, or None."""
        for name in ("bf16", "fp16"):
            if self.exact.get(name, 0.0) >= STORED_IN:
                return name
        return None

    def as_dict(self) -> dict:
        return {"values": self.values, "exactly_representable": {k: round(v, 6) for k, v in self.exact.items()},
                "stored_in": self.stored_in(), "dtypes": dict(self.dtypes), "invalid": list(self.invalid)}


def exactly_representable(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Elementwise: whether each value of ``t`` survives a round trip through ``dtype`` unchanged
    (finite values only; a value beyond the format's range becomes inf and does not)."""
    wide = t.detach().double()
    return torch.isfinite(wide) & (wide.to(dtype).double() == wide)


def checkpoint_facts(module: torch.nn.Module) -> CheckpointFacts:
    """The facts of the weights ``module`` holds (the checkpoint loaded into it)."""
    values = 0
    exact = {name: 0 for name in LOW_FORMATS}
    dtypes: Dict[str, int] = {}
    with torch.no_grad():
        for _, t in list(module.named_parameters()) + list(module.named_buffers()):
            if not t.is_floating_point() or t.numel() == 0:
                continue
            values += t.numel()
            key = str(t.dtype).replace("torch.", "")
            dtypes[key] = dtypes.get(key, 0) + t.numel()
            for name, dtype in LOW_FORMATS.items():
                exact[name] += int(exactly_representable(t, dtype).sum())
    fractions = {name: (count / values if values else 0.0) for name, count in exact.items()}
    return CheckpointFacts(values, fractions, dtypes, module_weights(module), invalid_values(module))


def invalid_values(module: torch.nn.Module) -> List[str]:
    """The tensors of ``module`` that hold values no trained checkpoint holds, one phrase each (in the
    order of the state dict): NaN or inf in a floating parameter or buffer, a negative running
    variance of a batch norm."""
    found = []
    with torch.no_grad():
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            if t is None or not t.is_floating_point() or t.numel() == 0 or t.is_meta:
                continue
            nan, inf = int(torch.isnan(t).sum()), int(torch.isinf(t).sum())
            counts = [f"{n} {word}" for n, word in ((nan, "NaN"), (inf, "inf")) if n]
            if counts:
                found.append(f"{name} holds {' and '.join(counts)} of {t.numel()} values")
        for path, m in module.named_modules():
            var = getattr(m, "running_var", None)
            if type(m).__name__ in _BATCH_NORMS and isinstance(var, torch.Tensor) and var.is_floating_point():
                negative = int((var.detach() < 0).sum())
                if negative:
                    where = f"{path}.running_var" if path else "running_var"
                    found.append(f"{where} holds {negative} negative variance{'s' if negative > 1 else ''} "
                                 f"(smallest {float(var.detach().min()):.3g})")
    return found


def module_weights(module: torch.nn.Module) -> Dict[str, ModuleWeights]:
    """Per module path (its own tensors only): the largest weight, and for a batch norm the scale
    it folds into the layer before and its largest running mean."""
    found: Dict[str, ModuleWeights] = {}
    with torch.no_grad():
        for path, m in module.named_modules():
            figures = ModuleWeights()
            weight = getattr(m, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.is_floating_point() and weight.numel():
                figures.weight_absmax = float(weight.detach().abs().max())
            if type(m).__name__ in _BATCH_NORMS:
                var = getattr(m, "running_var", None)
                if isinstance(var, torch.Tensor) and var.numel():
                    eps = float(getattr(m, "eps", 1e-5))
                    gamma = weight.detach().double() if isinstance(weight, torch.Tensor) else torch.ones_like(var, dtype=torch.float64)
                    scale = gamma / torch.sqrt(var.detach().double() + eps)
                    figures.folded_scale = float(scale.abs().max())
                mean = getattr(m, "running_mean", None)
                if isinstance(mean, torch.Tensor) and mean.numel():
                    figures.running_mean_absmax = float(mean.detach().abs().max())
            if figures.as_dict():
                found[path] = figures
    return found


def stored_sentence(label: str, facts: CheckpointFacts) -> str:
    """One sentence: how many of the checkpoint's values each low format holds exactly, and what that says."""
    shares = ", ".join(f"{_fraction_text(facts.exact[name])} exactly {name}" for name in LOW_FORMATS)
    stored = facts.stored_in()
    if stored is not None:
        what = f"it was stored in {stored} (or trained there without float32 master weights)"
    else:
        what = ("float32 values: it was not stored in a low format (mixed-precision training keeps float32 "
                "master weights, so this cannot tell whether it was trained under autocast)")
    return f"{label}: {shares} of {facts.values} values; {what}"


def _fraction_text(fraction: float) -> str:
    if fraction in (0.0, 1.0):
        return f"{fraction * 100:.0f}%"
    if fraction >= 0.999:
        return f"{fraction * 100:.1f}%"
    return f"{fraction * 100:.3g}%"
