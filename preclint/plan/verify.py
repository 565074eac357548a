"""Measuring a plan: the model run with the plan applied (preclint.policy, as a user deploys it)
against a float64 reference, on a GPU when there is one, else with the CPU's own float16/bfloat16
kernels and torch.autocast('cpu').

Two reference runs (a model that does not give the same output twice has a floor of noise no plan
can go below: probe/noise.py), one float32 run (the floor of precision), one run without the plan and
one per plan verified (none where the run without the plan meets: the plan is then empty). A run that goes inf/NaN names the first module whose output did, so that a
refinement can keep it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

import torch

from preclint.core.errors import one_line
from preclint.core.findings import ErrorFigure
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.compare import Comparison, Tolerance, compare
from preclint.measure.copies import copy_to
from preclint.measure.runners import FirstNonfinite, NativeRunner, run_reference
from preclint.policy import LOW_DTYPES, apply_policy, load_policy
from preclint.probe.noise import floor_of, run_to_run
from preclint.core.progress import task


@dataclass
class Run:
    summary: ErrorFigure
    meets: bool
    first_nonfinite: Optional[str] = None  # module whose output first went inf/NaN
    error: Optional[str] = None  # the run failed: why


class Verifier:
    """The precision's native runner, a plan's policy applied to a copy of the model, and the
    comparison with the float64 reference."""

    def __init__(self, module: torch.nn.Module, inputs: Inputs, precision: str, tolerance: Tolerance,
                 device: str = "auto") -> None:
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.precision = precision
        self.full = precision.endswith("-full")
        self.low = LOW_DTYPES[precision.split("-")[0]]
        self.tolerance = tolerance
        # the TF32 switches stay as the process has them: the plan is verified as its user deploys it
        self.runner = NativeRunner(precision, self.device, sets_tf32=False)
        self.inputs = inputs.map(lambda t: t.to(self.device))
        self.model32 = copy_to(module, self.device).eval()
        self.runs = 0
        # one float64 copy run twice: a model whose state moves between calls (its own generator) is
        # seen to move, as it would in use
        model64 = copy_to(self.model32, self.device, torch.float64)
        inputs64 = self.inputs.map(lambda t: t.to(torch.float64) if t.is_floating_point() else t)
        self.reference = self._reference(model64, inputs64)
        again = self._reference(model64, inputs64)
        del model64
        # the relative RMS between the two reference runs where the model is not deterministic, else None;
        # ``noise``: the second run judged by the tolerance
        self.noise_floor = floor_of(run_to_run(self.reference, again))
        self.noise = self._judge(compare(again, self.reference, tolerance))
        floor = run_reference(self.model32, self.inputs, self.device, None, sets_tf32=False)
        self.float32 = self._judge(compare(output_tensors(floor), self.reference, tolerance))

    def _reference(self, model64: torch.nn.Module, inputs64: Inputs) -> List[torch.Tensor]:
        # integer outputs (indices, labels, rounded values) stay integers: they are compared as decisions
        return [t if not (t.is_floating_point() or t.is_complex()) else t.double()
                for t in output_tensors(run_reference(model64, inputs64, self.device, None, sets_tf32=False))]

    @property
    def how(self) -> str:
        if self.full:
            return f"model cast with .to({self.low}) on {self.device}"
        return f"torch.autocast('{self.device.type}', dtype={self.low}) on {self.device}"

    def run(self, policy: Optional[dict]) -> Run:
        """The model under the precision, with ``policy`` applied (None: without a plan)."""

        with task(f"plan: run {self.runs + 1} ({'with the plan' if policy is not None else 'without a plan'})"):
            return self._run(policy)

    def _run(self, policy: Optional[dict]) -> Run:
        self.runs += 1
        model = copy_to(self.model32, self.device)
        if policy is None:
            # a cast model's caller feeds low inputs: the runner casts the copy and the inputs
            prepared = self.runner.prepare(model, self.inputs)
        else:
            # apply_policy casts the inputs on entry (or, where the plan keeps <inputs>, not)
            prepared = self.runner.adopt(apply_policy(model, load_policy(policy)), self.inputs)
        watch = FirstNonfinite(prepared.variant)
        try:
            outputs: List[torch.Tensor] = output_tensors(self.runner.run(prepared))
        except Exception as exc:  # a constant that does not convert, a kernel missing for the dtype
            return Run(ErrorFigure(None, None, finite=False), False, watch.first, one_line(exc))
        finally:
            watch.remove()
        return self._judge(compare(outputs, self.reference, self.tolerance), watch.first)

    @staticmethod
    def _judge(comparison: Comparison, first: Optional[str] = None) -> Run:
        return Run(comparison.figure, comparison.meets, first)
