"""Measuring a plan: the model run with the plan applied (preclint.policy, as a user deploys it)
against a float64 reference, on a GPU when there is one, else with the CPU's own float16/bfloat16
kernels and torch.autocast('cpu').

Two reference runs (a model that does not give the same output twice has a floor of noise no plan
can go below: probe/noise.py), one float32 run (the floor of precision), one run without the plan and
one per plan verified (none where the run without the plan meets: the plan is then empty). A run that goes inf/NaN names the first module whose output did, so that a
refinement can keep it.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any, List, Optional

import torch

from preclint.modelio import Inputs, output_tensors
from preclint.plan import ErrorSummary, Tolerance
from preclint.policy import LOW_DTYPES, apply_policy, load_policy
from preclint.probe.noise import floor_of, run_to_run


@dataclass
class Run:
    summary: ErrorSummary
    meets: bool
    first_nonfinite: Optional[str] = None  # module whose output first went inf/NaN
    error: Optional[str] = None  # the run failed: why


class Verifier:
    def __init__(self, module: torch.nn.Module, inputs: Inputs, precision: str, tolerance: Tolerance,
                 device: str = "auto") -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.precision = precision
        self.full = precision.endswith("-full")
        self.low = LOW_DTYPES[precision.split("-")[0]]
        self.tolerance = tolerance
        self.inputs = inputs.map(lambda t: t.to(self.device))
        self.model32 = copy.deepcopy(module).to(self.device).eval()
        self.runs = 0
        with torch.no_grad():
            model64 = copy.deepcopy(self.model32).double()
            self.reference = self._reference(model64)
            again = self._reference(model64)
        del model64
        # the relative RMS between the two reference runs where the model is not deterministic, else None;
        # ``noise``: the second run judged by the tolerance
        self.noise_floor = floor_of(run_to_run(self.reference, again))
        self.noise = self._compare(again)
        self.float32 = self._compare(self._outputs(self.model32, self.inputs, None))

    def _reference(self, model64) -> List[torch.Tensor]:
        # integer outputs (indices, labels, rounded values) stay integers: they are compared as decisions
        return [t if not (t.is_floating_point() or t.is_complex()) else t.double()
                for t in output_tensors(self.inputs.map(_as64).call(model64))]

    @property
    def how(self) -> str:
        if self.full:
            return f"model cast with .to({self.low}) on {self.device}"
        return f"torch.autocast('{self.device.type}', dtype={self.low}) on {self.device}"

    def run(self, policy: Optional[dict]) -> Run:
        """The model under the precision, with ``policy`` applied (None: without a plan)."""
        from preclint.progress import task

        with task(f"plan: run {self.runs + 1} ({'with the plan' if policy is not None else 'without a plan'})"):
            return self._run(policy)

    def _run(self, policy: Optional[dict]) -> Run:
        self.runs += 1
        model = copy.deepcopy(self.model32)
        if policy is not None:
            apply_policy(model, load_policy(policy))
        elif self.full:
            model.to(self.low)
        # a cast model's caller feeds low inputs; with a plan, apply_policy casts them on entry (or,
        # where the plan keeps <inputs>, not)
        cast = self.full and policy is None
        inputs = self.inputs.map(lambda t: t.to(self.low) if cast and t.is_floating_point() else t)
        watch = _FirstNonfinite(model)
        try:
            outputs = self._outputs(model, inputs, self.low if not self.full else None)
        except Exception as exc:  # a constant that does not convert, a kernel missing for the dtype
            from preclint.probe.execute import one_line

            return Run(ErrorSummary(None, None, False), False, watch.first, one_line(exc))
        finally:
            watch.remove()
        return self._compare(outputs, watch.first)

    def _outputs(self, model, inputs: Inputs, autocast: Optional[torch.dtype]) -> List[torch.Tensor]:
        with torch.no_grad():
            if autocast is not None:
                with torch.autocast(self.device.type, dtype=autocast):
                    return output_tensors(inputs.call(model))
            return output_tensors(inputs.call(model))

    def _compare(self, outputs: List[torch.Tensor], first: Optional[str] = None) -> Run:
        tol = self.tolerance
        rtol, atol = tol.rtol or 0.0, tol.atol or 0.0
        sq_err = sq_ref = 0.0
        max_abs = 0.0
        failing = numel = 0
        finite = True
        flips: List[float] = []
        if len(outputs) != len(self.reference):
            return Run(ErrorSummary(None, None, True, None, 1.0), False, first)
        for out, ref in zip(outputs, self.reference):
            if out.shape != ref.shape:  # detections: another number of boxes
                flips.append(1.0)
                continue
            if not ref.is_floating_point():
                flips.append(float((out != ref).float().mean()) if ref.numel() else 0.0)
                continue
            d = out.double() - ref
            if not bool(torch.isfinite(d).all()):
                finite = False
                continue
            sq_err += float((d * d).sum())
            sq_ref += float((ref * ref).sum())
            max_abs = max(max_abs, float(d.abs().max()) if d.numel() else 0.0)
            failing += int((d.abs() > atol + rtol * ref.abs()).sum())
            numel += d.numel()
            if ref.dim() >= 2 and ref.shape[-1] > 1 and tol.max_flip is not None:  # class scores: top-1
                flips.append(float((out.argmax(-1) != ref.argmax(-1)).float().mean()))
        rel = math.sqrt(sq_err / sq_ref) if sq_ref > 0 else (0.0 if sq_err == 0 else None)
        fraction = failing / numel if numel and tol.compares_values else None
        flip = max(flips) if flips else None
        summary = ErrorSummary(rel if finite else None, max_abs if finite else None, finite, fraction, flip)
        budget = tol.max_flip if tol.max_flip is not None else 0.0
        meets = finite and (not failing or not tol.compares_values) and (flip is None or flip <= budget)
        return Run(summary, meets, first)


def _as64(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


class _FirstNonfinite:
    """Forward hooks on the leaf modules that remember the first whose float output is inf/NaN."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.first: Optional[str] = None
        self.handles = []
        for name, module in model.named_modules():
            if name and not any(True for _ in module.children()):
                self.handles.append(module.register_forward_hook(self._hook(name)))

    def _hook(self, name: str):
        def hook(module, args, output) -> Any:
            if self.first is None and any(t.is_floating_point() and not bool(torch.isfinite(t).all())
                                          for t in output_tensors(output)):
                self.first = name
        return hook

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
