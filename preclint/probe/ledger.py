"""What the probe measured: per mode and node, the error a node introduces (local), the error it
carries (received), how much it amplifies what reaches it, and its share of the output error.

Definitions (all errors against the float64 reference run on the same device):

* ``received``: the node's value in the full run of the mode minus its reference value.
* ``local``: the node replayed in the mode on its reference inputs, each rounded to the dtype it has
  in the mode's run, minus the node computed exactly on those same rounded inputs (float32 without
  TF32 stands in for exact where the inputs are float16/bfloat16: its own error, about 2^-24
  relative, is over 1000 times below what it is subtracted from). A rounding of a value is thereby
  charged once, to the node that stored it; parameters count as the node's own inputs.
* ``amplification``: sqrt(max(received_out^2 - local^2, 0)) / received_in, in relative RMS terms:
  the gain that turns the relative error arriving at the node's inputs into the part of its output
  error it did not add itself (independent errors add in quadrature). Where local dominates the
  estimate is loose; where amplification matters (a layer multiplying incoming error) it is not.
* ``contribution``: <J_i e_i, E> / ||E||^2, with e_i the node's local error vector, J_i the Jacobian
  of the output with respect to the node's value and E the measured output error. One backward pass
  per mode gives J_i^T E for every node at once. The shares sum to the fraction of E that first-order
  propagation of the local errors explains (``explained``); ``--ablate`` checks them against exact
  runs that inject one node's local error at a time.

``rel_error`` is RMS(error) / RMS(reference value); ``max_abs_error`` the largest absolute error.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from preclint.core.findings import ErrorFigure
from preclint.core.notes import Note


@dataclass
class NodeMeasure:
    dtype: Optional[str] = None  # dtype of the node's (first float) result in the mode's run
    local: Optional[ErrorFigure] = None
    received: Optional[ErrorFigure] = None
    amplification: Optional[float] = None
    contribution: Optional[float] = None
    nonfinite: bool = False  # inf/NaN in the mode's run where the reference is finite
    tf32_applied: Optional[bool] = None  # conv/matmul under tf32: TF32-sized local error (True) or fp32-sized
    local_rms: Optional[float] = None  # the local error's RMS, which tf32_applied is judged from (not printed)
    flips: Optional[int] = None  # decisions: units whose outcome changed
    units: Optional[int] = None
    ablation: Optional[Dict[str, float]] = None  # {"contribution", "alone"} from the exact one-node run
    note: Optional[str] = None  # why a figure is missing

    @property
    def flip_fraction(self) -> Optional[float]:
        if self.flips is None or not self.units:
            return None
        return self.flips / self.units


@dataclass
class ToleranceCheck:
    """The measured output against ``assert_close``'s rule |d| <= atol + rtol |ref|."""

    rtol: float
    atol: float
    failing: int  # elements that fail
    numel: int
    min_atol: Optional[float]  # the smallest atol that passes with this rtol
    min_rtol: Optional[float]  # the smallest rtol that passes with this atol (None: none does)


@dataclass
class ModeMeasure:
    mode: str
    how: str  # how the mode ran (native switch or emulation)
    nodes: Dict[str, NodeMeasure] = field(default_factory=dict)
    output: Optional[ErrorFigure] = None
    outputs: List[Optional[ErrorFigure]] = field(default_factory=list)  # a model with several float outputs: each one's
    output_finite: Optional[bool] = None
    output_flips: Optional[int] = None  # integer outputs (labels): elements that changed
    output_units: Optional[int] = None
    detections: Optional[Any] = None  # detections.DetectionChanges: the output's detection sets against the reference
    first_nonfinite: Optional[str] = None  # the first node whose value became inf/NaN
    explained: Optional[float] = None  # sum of contributions
    observer_delta: Optional[float] = None  # max |output of the observed run - output of the plain model|
    tolerance: Optional[ToleranceCheck] = None
    agreement: Optional[Dict[str, Any]] = None  # contributions against --ablate
    diverged_at: Optional[str] = None  # control flow left the reference's path at this node
    # nodes whose results hold their units in another order than the reference's: an order decision
    # (top-k, sort) that ranked near-ties otherwise, and what gathers by it (probe/sweep.py, reordered)
    reordered: List[str] = field(default_factory=list)
    error: Optional[str] = None  # "could not measure": why
    notes: List[Note] = field(default_factory=list)

    @property
    def measured(self) -> bool:
        return self.error is None


@dataclass
class ProbeResult:
    environment: Dict[str, Any]
    modes: Dict[str, ModeMeasure]
    order: List[str]  # node names in execution order
    timings: Dict[str, float] = field(default_factory=dict)  # seconds per stage (benchmarks; not in reports)
    notes: List[Note] = field(default_factory=list)
    reference_nonfinite: List[str] = field(default_factory=list)  # nodes inf/NaN already in float64
    graph: Any = None  # the graph the probe recorded itself, where it was given none (distributed.py)
    # relative RMS between two reference runs of a model that is not deterministic, else None (noise.py)
    noise_floor: Optional[float] = None
    backend: Any = None  # probe.compiled.BackendComparison where a compiled backend was measured too
    # float32 here against float32 on --reference-device, each against float64 (measure/devices.py)
    cross_device: Any = None
    across: Optional[ModeMeasure] = None  # the same, node by node (probe/across.py)

    @property
    def noise_margin(self) -> float:
        """How many times the noise floor a measured error must exceed to tell it from the noise."""
        from preclint.probe.noise import NOISE_MARGIN  # lazy: torch-free path

        return NOISE_MARGIN

    def within_noise(self, measured: Optional[float]) -> bool:
        """Whether a measured relative error cannot be told from the model's run-to-run noise."""
        from preclint.probe.noise import within_noise  # lazy: torch-free path

        return within_noise(self.noise_floor, measured)


def rounded(value: Optional[float], digits: int = 4) -> Optional[float]:
    """Significant digits for the report: more would print noise as if it were signal."""
    if value is None or not math.isfinite(value):
        return None
    if value == 0:
        return 0.0
    return float(f"{value:.{digits}g}")


def node_row(graph, ctx, result: ProbeResult, name: str) -> Dict[str, Any]:
    """One node of ``preclint probe --output-format json``."""
    node = graph[name]
    location = None
    if node.location is not None:
        from preclint.locations.attach import display_location  # lazy: torch-free path

        location = display_location(node.location).as_dict()
    row: Dict[str, Any] = {
        "node": name,
        "module": node.module_path,
        "op": node.target,
        "kind": node.kind,
        "location": location,
        "modes": {},
    }
    if ctx is not None:  # the node as findings name it (``model[0] (Linear)`` in an nn.Sequential)
        row["label"] = ctx.display(name)
    for mode, measure in result.modes.items():
        m = measure.nodes.get(name)
        if measure.error is not None or m is None:
            row["modes"][mode] = {"error": measure.error or m_note(measure, name)}
            continue
        entry: Dict[str, Any] = {
            "dtype": m.dtype,
            "local": _figure(m.local),
            "received": _figure(m.received),
            "amplification": rounded(m.amplification),
            "contribution": rounded(m.contribution),
        }
        prediction = ctx.predictions.get(mode) if ctx is not None else None
        if prediction is not None and name in prediction.nodes and node.out is not None and node.out.rms > 0:
            entry["predicted"] = {
                "local": rounded(prediction.nodes[name].local / node.out.rms),
                "contribution": rounded(prediction.contributions.get(name)),
            }
        if m.nonfinite:
            entry["nonfinite"] = True
        if m.tf32_applied is not None:
            entry["tf32_applied"] = m.tf32_applied
        if m.flips is not None:
            entry["flip_fraction"] = rounded(m.flip_fraction)
            entry["flips"] = m.flips
            entry["units"] = m.units
        if m.ablation is not None:
            entry["ablation"] = {k: rounded(v) for k, v in m.ablation.items()}
        if m.note:
            entry["note"] = m.note
        row["modes"][mode] = entry
    return row


def m_note(measure: ModeMeasure, name: str) -> str:
    if measure.diverged_at is not None:
        return f"not compared: control flow left the reference's path at {measure.diverged_at}"
    return "not reached in this mode's run"


def _figure(figure: Optional[ErrorFigure]) -> Optional[Dict[str, Optional[float]]]:
    if figure is None:
        return None
    return {"rel_error": rounded(figure.rel_error), "max_abs_error": rounded(figure.max_abs_error)}
