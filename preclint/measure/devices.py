"""Float32 on two devices: the expected outputs recorded on one device (the CPU, say) and compared on
another (a GPU), each also against float64 on its own device.

No precision setting is involved: both runs are float32 with TF32 off. What differs is the order in
which the two devices' kernels add (cuDNN's and oneDNN's convolutions, cuBLAS's and MKL's GEMMs), so
the two runs carry independent float32 rounding errors, and a decision whose margin lies within them
(a top-k over near-tied scores, an NMS between overlapping boxes of equal score) goes one way on one
device and the other way on the other. The fp32 mode predicts that; this module measures it.

Where the two devices are the same, the reference runs the other kernel family the device has
(the CPU without oneDNN, a GPU without cuDNN): the same device, other kernels, the same question.
"""
from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from typing import Any, Dict, Optional

import torch

from preclint.core.errors import UserError
from preclint.core.findings import ErrorFigure
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.backends import tf32
from preclint.measure.compare import Tolerance, compare
from preclint.measure.copies import copy_to
from preclint.measure.detections import DetectionChanges, compare_detections, detection_tensor_ids
from preclint.measure.runners import run_reference
from preclint.capture.trees import map_tensors


def reference_device(choice: str) -> torch.device:
    """The device ``--reference-device CHOICE`` names (cpu, cuda, cuda:N), checked."""
    try:
        device = torch.device(choice)
    except (RuntimeError, TypeError):
        raise UserError(f"--reference-device {choice!r}: not a device (cpu, cuda or cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise UserError(f"--reference-device {choice!r}: preclint compares float32 on cpu or cuda devices")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--reference-device {choice}: torch {torch.__version__} sees no CUDA device")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif device.index >= torch.cuda.device_count():
            raise UserError(f"--reference-device {choice}: there are {torch.cuda.device_count()} CUDA devices")
    return device


@contextlib.contextmanager
def other_kernels(device: torch.device):
    """The device's other kernel family for convolutions: oneDNN off on the CPU, cuDNN off on a GPU."""
    if device.type == "cuda":
        with torch.backends.cudnn.flags(enabled=False):
            yield
        return
    with warnings.catch_warnings():
        # (the switch also sets oneDNN's TF32 flag, which warns on a CPU build; no TF32 is involved)
        warnings.simplefilter("ignore", UserWarning)
        with torch.backends.mkldnn.flags(enabled=False):
            yield


def kernels_of(device: torch.device, other: bool) -> str:
    """How the report names the kernels a float32 run used."""
    if device.type == "cuda":
        return "CUDA kernels without cuDNN" if other else "cuDNN and cuBLAS"
    return "CPU kernels without oneDNN" if other else "oneDNN and BLAS"


def float32_output(model: torch.nn.Module, inputs, device: torch.device, other: bool = False) -> Any:
    """The output of ``model`` in float32 on ``device``, TF32 off (explicitly: a float32 run on a GPU
    with cuDNN's default would use TF32 convolutions); ``other``: with the other kernel family."""
    with torch.no_grad(), tf32(False), (other_kernels(device) if other else contextlib.nullcontext()):
        return Inputs.of(inputs).call(model)


@dataclass
class OutputsAgainst:
    """One run's outputs against another run's: the values' error, and the decisions that changed.

    ``figure``: ``rel_error`` and ``max_abs_error`` over the float outputs that are not detections (None:
    none, or not finite); ``flip_fraction`` over the integer outputs (labels, indices) and detections."""

    figure: ErrorFigure
    decisions: int  # the decisions judged (integer elements, detections)
    detections: Optional[DetectionChanges] = None

    def as_dict(self) -> Dict[str, Any]:
        figure = self.figure
        out: Dict[str, Any] = {"rel_error": figure.rel_error, "max_abs_error": figure.max_abs_error,
                               "flip_fraction": figure.flip_fraction, "decisions": self.decisions}
        if self.detections is not None:
            out["detections"] = self.detections.as_dict()
        return out

    def describe(self) -> str:
        parts = []
        figure = self.figure
        if figure.rel_error is not None:
            parts.append(f"relative RMS {figure.rel_error:.3g} (max abs {figure.max_abs_error:.3g})")
        if figure.flip_fraction is not None:
            parts.append(f"{figure.flip_fraction:.3g} of {self.decisions} decisions changed")
        if self.detections is not None:
            parts.append(self.detections.describe())
        return "; ".join(parts) or "nothing to compare"


def compare_outputs(output: Any, reference: Any) -> OutputsAgainst:
    """``output`` against ``reference``: detection sets matched by IoU (detections.py), every other
    tensor position by position (compare.compare), integer ones as decisions."""
    detections = compare_detections(output, reference)
    skip_out, skip_ref = detection_tensor_ids(output), detection_tensor_ids(reference)
    outs = [t for t in output_tensors(output) if id(t) not in skip_out]
    refs = [t for t in output_tensors(reference) if id(t) not in skip_ref]
    outs = [t.to(r.device) for t, r in zip(outs, refs)] if len(outs) == len(refs) else outs
    plain = compare(outs, refs, Tolerance()) if outs or refs else None
    flips, decisions = [], 0
    if plain is not None and plain.flip_fraction is not None:
        flips.append(plain.flip_fraction * max(plain.decisions, 1))
        decisions += plain.decisions
    if detections is not None and detections.changes.units:
        flips.append(float(detections.changes.changed))
        decisions += detections.changes.units
    floats = plain is not None and any(r.is_floating_point() for r in refs)
    return OutputsAgainst(
        ErrorFigure(plain.rel_rms if floats else None, plain.max_abs if floats else None,
                    sum(flips) / decisions if decisions else None),
        decisions,
        detections.changes if detections is not None else None,
    )


@dataclass
class CrossDevice:
    """Float32 on the probe's device against float32 on the reference device, and each against float64."""

    device: str
    reference_device: str
    kernels: str  # which kernels each float32 run used
    between: OutputsAgainst  # float32 here against float32 there: what a test of recorded outputs sees
    device_vs_float64: OutputsAgainst
    reference_vs_float64: OutputsAgainst

    def as_dict(self) -> Dict[str, Any]:
        return {"device": self.device, "reference_device": self.reference_device, "kernels": self.kernels,
                "between": self.between.as_dict(), "device_vs_float64": self.device_vs_float64.as_dict(),
                "reference_vs_float64": self.reference_vs_float64.as_dict()}


def across_devices(model32: torch.nn.Module, inputs32, device: torch.device, reference: torch.device) -> CrossDevice:
    """``model32`` (float32, on ``device``) in float32 there and on ``reference``, and in float64 on each."""
    same = reference == device
    there = model32 if same else copy_to(model32, reference)
    there_inputs = Inputs.of(inputs32).map(lambda t: t.to(reference))
    here_out = float32_output(model32, inputs32, device)
    there_out = float32_output(there, there_inputs, reference, other=same)
    here64 = run_reference(model32, inputs32, device)
    there64 = here64 if same else run_reference(there, there_inputs, reference)
    kernels = f"{device} ({kernels_of(device, False)}) against {reference} ({kernels_of(reference, same)})"
    return CrossDevice(str(device), str(reference), kernels,
                       compare_outputs(here_out, _on(there_out, device)),
                       compare_outputs(here_out, here64),
                       compare_outputs(there_out, there64))


def _on(value: Any, device: torch.device) -> Any:
    """``value`` (an output: tensors in lists, tuples and dicts) with its tensors on ``device``."""

    return map_tensors(lambda t: t.to(device), value)
