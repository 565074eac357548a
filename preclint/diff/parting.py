"""Where two runs part: the same inputs through two settings (two precisions, two checkpoints of one
architecture, two devices), compared node by node along the model.

The first run is recorded (every node's value); the second follows it, in the walk the probe's
sweep takes too (measure/sweep.py's Sweep, whose first run there is float64): at each node its value
against the first run's (``difference``), and the node replayed in the second setting on the first
run's operands (``contributed``: what the node itself changes; the rest of the difference it
``inherited`` from the nodes before it, in quadrature). The first setting run a second time gives
each node's noise floor: a difference counts only at ``NOISE_MARGIN`` times that floor and above
float32's own resolution, and the first node past it is where the runs part.

A decision (argmax, top-k, sort, NMS, a threshold, an MoE router's top-k) is replayed: the second
run once more with the first run's choices forced into it (for a top-k its values are then the
second run's own at the first run's indices), and the part of the squared output difference that
disappears is the part those choices explain.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence, Tuple

import torch

from preclint.capture.calls import is_inplace_call
from preclint.core.errors import one_line
from preclint.core.ir import Kind
from preclint.load.modelio import Inputs, output_tensors
from preclint.measure.compare import LARGEST, compare, relative_rms
from preclint.measure.program import Program
from preclint.measure.runners import runner_for
from preclint.measure.sweep import RecordedRun, Sweep, adds_no_rounding, decision_changes
from preclint.probe.noise import DETERMINISTIC_BELOW, NOISE_MARGIN

# nodes that compute nothing of their own: their difference is their operand's
_NO_REPLAY = frozenset({Kind.INPUT, Kind.OUTPUT, Kind.CONSTANT, Kind.SHAPE})
_PAIRED = frozenset({"topk", "sort", "max", "min", "kthvalue", "mode", "median"})  # (values, indices)


@dataclass(frozen=True)
class Setting:
    """One way to run: a float32 model on ``device`` and a precision mode (None: float32 itself)."""

    label: str
    model: torch.nn.Module
    mode: Optional[str]
    device: Any = "cpu"
    emulated: Optional[bool] = None  # None: emulated exactly where the device is the CPU


class _Float32:
    """The run of a float32 model as it is: the interface of measure.modes.ModeRun, doing nothing."""

    def __init__(self, model, inputs) -> None:
        self.variant, self.inputs = model, inputs

    def before(self, node, args, kwargs, callee, inplace: bool = False):
        return args, kwargs, None

    def after(self, output, decision, replay: bool = False):
        return output

    def entering(self, node, output):
        return output

    def context(self):
        return contextlib.nullcontext()


def prepare(setting: Setting, inputs, graph):
    """The run of ``setting`` on ``inputs`` (float32, moved to its device)."""
    device = torch.device(setting.device)
    inputs = Inputs.of(inputs).map(lambda t: t.detach().to(device))
    if setting.mode is None:
        return _Float32(setting.model, inputs)
    return runner_for(setting.mode, device, setting.emulated).prepare(setting.model, inputs, graph)


@dataclass
class NodeParting:
    """One node in the second run against the first (relative RMS of the first's value)."""

    name: str
    difference: Optional[float] = None
    contributed: Optional[float] = None
    floor: float = 0.0  # the first setting against itself
    flips: Optional[int] = None  # decisions: units whose outcome changed
    units: Optional[int] = None
    note: Optional[str] = None

    @property
    def inherited(self) -> Optional[float]:
        if self.difference is None or self.contributed is None or math.isinf(self.contributed):
            return None  # (a node that makes the inf/NaN itself: what it received is not told apart)
        return math.sqrt(max(self.difference ** 2 - self.contributed ** 2, 0.0))

    @property
    def threshold(self) -> float:
        return max(NOISE_MARGIN * self.floor, DETERMINISTIC_BELOW)

    @property
    def parts(self) -> bool:
        return self.difference is not None and self.difference > self.threshold


@dataclass
class Replay:
    """One decision of the first run forced into the second."""

    node: str
    flips: int
    units: int
    explained: Optional[float]  # fraction of the squared output difference that disappears
    remaining: Optional[float]  # the output difference with the choices forced (relative RMS)
    note: Optional[str] = None


@dataclass
class Parting:
    """Two runs compared along the model."""

    labels: Tuple[str, str]
    nodes: List[NodeParting] = field(default_factory=list)  # execution order
    output_difference: Optional[float] = None
    replays: List[Replay] = field(default_factory=list)
    replay_all: Optional[Replay] = None  # every decision that changed, forced at once
    notes: List[str] = field(default_factory=list)

    @property
    def first(self) -> Optional[NodeParting]:
        return next((n for n in self.nodes if n.parts), None)

    def as_dict(self, module_of=lambda name: "") -> dict:
        first = self.first
        return {
            "runs": list(self.labels),
            "first_divergent": None if first is None else {"node": first.name, "module": module_of(first.name),
                                                            "difference": _r(first.difference),
                                                            "noise_threshold": _r(first.threshold)},
            "output_difference": _r(self.output_difference),
            "output_non_finite": self.output_difference is not None and math.isinf(self.output_difference),
            "along": [{"node": n.name, "module": module_of(n.name), "difference": _r(n.difference),
                       **({"non_finite": True} if n.difference is not None and math.isinf(n.difference) else {}),
                       "contributed": _r(n.contributed), "inherited": _r(n.inherited), "floor": _r(n.floor),
                       **({"flips": n.flips, "units": n.units} if n.flips is not None else {}),
                       **({"note": n.note} if n.note else {})} for n in self.nodes],
            "replays": [_replay_dict(r) for r in self.replays],
            "replay_all": _replay_dict(self.replay_all) if self.replay_all else None,
            "notes": list(self.notes),
        }


def _replay_dict(r: Replay) -> dict:
    out = {"node": r.node, "flips": r.flips, "units": r.units, "explained": _r(r.explained),
           "remaining_difference": _r(r.remaining)}
    if r.note:
        out["note"] = r.note
    return out


def _r(value: Optional[float]) -> Optional[float]:
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.4g}") if value else 0.0


class _Follower(Sweep):
    """Runs one setting; records it (``first`` None) or follows ``first`` (measure/sweep.py):
    differences, replays on the first run's operands (``replay``), decisions forced to the first
    run's (``force``)."""

    def __init__(self, run, first: Optional[RecordedRun], inplace_semantics: bool, replay: bool = False,
                 force: Sequence[str] = ()) -> None:
        super().__init__(run, first, inplace_semantics)
        self.replays = replay
        self.force = frozenset(force)
        self.nodes: List[NodeParting] = []
        self.output: Any = None

    def steer(self, node, output, theirs, args, kwargs):
        return _forced(node, output, theirs, args, kwargs) if node.name in self.force else output

    def observe(self, node, args, kwargs, callee, outs, theirs) -> None:
        row = NodeParting(node.name)
        row.difference = relative_rms(outs, theirs, nonfinite=LARGEST)
        if node.kind in (Kind.DECISION, Kind.COMPARE):
            flips = units = 0
            for o, t in zip(outs, theirs):
                if o.is_floating_point() or t.is_floating_point():
                    continue
                changes = decision_changes(node, o, t)
                if changes is not None:
                    flips += int(changes[0])
                    units += int(changes[1])
            if units:
                row.flips, row.units = flips, units
        if adds_no_rounding(node.fn, args, kwargs, outs):
            row.contributed = 0.0
        elif self.replays and node.kind not in _NO_REPLAY and callee is not None and row.difference is not None:
            row.contributed, row.note = self._replayed(node, args, kwargs, callee, theirs)
        elif node.kind in _NO_REPLAY or callee is None:
            row.contributed = 0.0 if node.kind == Kind.SHAPE else row.difference
        self.nodes.append(row)

    def _replayed(self, node, args, kwargs, callee, theirs) -> Tuple[Optional[float], Optional[str]]:
        """The node in this setting on the first run's operands, against the first run's value."""
        if is_inplace_call(callee, kwargs):
            return None, "not replayed: it writes its operand in place"
        ref_args, ref_kwargs = self.first_operands(args, kwargs)
        try:
            replayed = self.replay(node, ref_args, ref_kwargs, callee)
        except Exception as exc:  # noqa: BLE001 - a node that cannot be called again alone: said, the rest measured
            return None, f"not replayed: {one_line(exc)}"
        return relative_rms(replayed, theirs, nonfinite=LARGEST), None


def _forced(node, output, theirs: List[torch.Tensor], args, kwargs):
    """``output`` with the first run's choices: its integer (and boolean) results replaced, and for a
    (values, indices) op the values taken from this run's own operand at those indices."""
    if isinstance(output, torch.Tensor):
        if not output.is_floating_point() and theirs and not theirs[0].is_floating_point():
            return theirs[0].to(output.device)
        return output
    if node.fn in _PAIRED and isinstance(output, tuple) and len(output) == 2 and len(theirs) == 2:
        values, indices = output
        chosen = theirs[1].to(indices.device)
        operand = args[0] if args and isinstance(args[0], torch.Tensor) else None
        dim = kwargs.get("dim", node.attrs.get("dim", -1 if node.fn != "max" else None))
        if operand is None or not isinstance(dim, int) or chosen.shape != indices.shape:
            return output
        if chosen.dim() < operand.dim():  # max/min over a dim drop it: gather needs it back
            picked = operand.gather(dim, chosen.unsqueeze(dim)).squeeze(dim)
        else:
            picked = operand.gather(dim, chosen)
        picked = picked.to(values.dtype)
        try:
            return type(output)((picked, chosen))
        except TypeError:
            return (picked, chosen)
    return output


def _run(program: Program, run, first: Optional[RecordedRun] = None, **observing) -> _Follower:
    observer = _Follower(run, first, inplace_semantics=not program.is_fx, **observing)
    with torch.no_grad(), run.context():
        observer.output = program.run(run.variant, run.inputs, observer)
    if observer.record is not None:
        observer.record.output = observer.output
    return observer


def _output_difference(output, reference) -> Optional[float]:
    outs = [t.detach().cpu() for t in output_tensors(output) if t.is_floating_point()]
    refs = [t.detach().cpu().double() for t in output_tensors(reference) if t.is_floating_point()]
    if len(outs) != len(refs):
        return compare(outs, refs).rel_rms
    return relative_rms(outs, refs, nonfinite=LARGEST)


def part(first: Setting, second: Setting, inputs, graph, *, replay_decisions: bool = True) -> Parting:
    """The runs of ``first`` and ``second`` on ``inputs`` compared along ``graph`` (the check's
    capture of the model), with the noise floor of ``first`` run twice and the decisions replayed."""
    parting = Parting((first.label, second.label))
    program_one = Program(graph, first.model)
    program_two = Program(graph, second.model)
    run_one = prepare(first, inputs, graph)
    recorded = _run(program_one, run_one).record
    again = _run(program_one, prepare(first, inputs, graph), recorded)
    floors = {n.name: n.difference or 0.0 for n in again.nodes}
    run_two = prepare(second, inputs, graph)
    followed = _run(program_two, run_two, recorded, replay=True)
    for row in followed.nodes:
        row.floor = floors.get(row.name, 0.0)
    parting.nodes = followed.nodes
    if followed.left_at is not None:
        parting.notes.append(f"the second run left the first run's path at {followed.left_at} (another branch of the "
                             "model's control flow): nothing after it is compared")
    full = parting.output_difference = _output_difference(followed.output, recorded.output)
    if not replay_decisions:
        return parting
    changed = [n for n in parting.nodes if n.flips]
    for row in changed:
        parting.replays.append(_replay(program_two, second, inputs, graph, recorded, [row], full=full))
    if len(changed) > 1:
        parting.replay_all = _replay(program_two, second, inputs, graph, recorded, changed, full=full)
        parting.replay_all.node = "every decision that changed"
    return parting


def _replay(program, second: Setting, inputs, graph, recorded, rows: List[NodeParting], *, full: Optional[float]) -> Replay:
    flips, units = sum(r.flips or 0 for r in rows), sum(r.units or 0 for r in rows)
    name = rows[0].name
    try:
        forced = _run(program, prepare(second, inputs, graph), recorded, force=[r.name for r in rows])
    except Exception as exc:  # noqa: BLE001 - one replay that fails leaves the others
        return Replay(name, flips, units, None, None, f"not replayed: {one_line(exc)}")
    remaining = _output_difference(forced.output, recorded.output)
    explained = None
    if full and remaining is not None:
        if math.isinf(full):  # an inf/NaN difference: the choices explain it where forcing them removes it
            explained = 1.0 if math.isfinite(remaining) else None
        else:
            explained = 1.0 - (remaining / full) ** 2
    note = None if forced.left_at is None else f"with the choices forced the run left the first run's path at {forced.left_at}"
    return Replay(name, flips, units, explained, remaining, note)
