"""One mode's sweep: the full run of the mode, observed and never altered (on a GPU the observed run
is checked against the plain model afterwards), walked beside the float64 run by measure/sweep.py's
Sweep, the walk diff's parting takes too. At each node the observer compares the value with the
reference (received) and replays the node on reference inputs (local), keeping the local error
vector for the contribution. Its figures are queued in the sweep's Scalars (readback.py reads them)."""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.core.errors import one_line
from preclint.core.ir import Kind
from preclint.reference.analyses.margins import DecisionMargins
from preclint.capture.calls import is_inplace_call
from preclint.measure.detections import changed_decisions
from preclint.measure.modes import ModeRun
from preclint.measure.program import Program
from preclint.measure.sweep import Sweep, adds_no_rounding, decision_changes
from preclint.measure.rounding import REDUCED_FLOATS
from preclint.measure.execute import invoke, tensors
from preclint.probe.noise import RANDOM_OPS
from preclint.probe.reference_pass import ReferenceStore
from preclint.probe.scalars import Scalars, difference, error_dtype
from preclint.capture.trees import flatten
from preclint.load.modelio import Inputs

# ops that keep the value they are given (casts, clamps to a format's range): a precision may add them
_VALUE_KEEPING = frozenset({"to", "type", "type_as", "float", "half", "bfloat16", "double", "contiguous", "clone",
                            "detach", "clamp", "clip", "clamp_min", "clamp_max", "nan_to_num"})


def _name_base(fn: str) -> str:
    """The base of the names function-mode capture gives ops of kind ``fn`` (capture/recorder.py, _Recorder._unique)."""
    return re.sub(r"\W", "_", fn) or "op"


_NO_REPLAY_KINDS = frozenset({Kind.INPUT, Kind.OUTPUT, Kind.CONSTANT, Kind.SHAPE, Kind.DECISION, Kind.COMPARE})


class NodeSlots:
    """Where one node's figures sit in the sweep's Scalars."""

    __slots__ = ("received", "local", "local_zero", "flips", "inputs", "dtype", "note", "local_from_received")

    def __init__(self) -> None:
        self.received: List[Tuple[int, int, int]] = []  # (output index, ||d||_2, ||d||_inf)
        self.local: List[Tuple[int, int, int]] = []
        self.local_zero = False  # moves values only: no local error by construction
        self.local_from_received = False  # enters the graph: its rounding on entry is its local error
        self.flips: List[Tuple[int, int]] = []  # (flipped units slot, units slot)
        self.inputs: List[Tuple[str, int]] = []  # producers of its float inputs
        self.dtype: Optional[str] = None
        self.note: Optional[str] = None


def counts_flips(node, graph) -> bool:
    """Whether a sweep counts the changed decisions of ``node``: decisions and comparisons, and the
    ops the margins analysis gave margins (a max or min over a dim); where that analysis did not
    run (a rank that measures without the check's statistics, distributed.py), every op it could
    have given them, which rank 0 then narrows with its own graph."""
    if node.kind in (Kind.DECISION, Kind.COMPARE):
        return True
    if node.fn not in ("max", "min") or "dim" not in node.attrs:
        return False  # (the analysis gives no other op margins)
    if graph.computed((DecisionMargins,)):
        ir = graph.get(node.name)
        return ir is not None and ir.record(DecisionMargins) is not None
    return True


class _Unmatched(Exception):
    pass


class SweepObserver(Sweep):
    """The walk (measure/sweep.py) of a mode's run beside the float64 run: each node's received error
    (its value against the reference's), local error (the node replayed on the reference's operands),
    and changed decisions."""

    def __init__(self, run: ModeRun, ref: ReferenceStore, graph, inplace_semantics: bool, keep_errors: bool) -> None:
        super().__init__(run, ref, inplace_semantics)
        self.graph = graph
        self.keep_errors = keep_errors
        self.error_dtype = error_dtype(run.device)
        self.added: Dict[str, int] = {}  # ops a precision added to the reference's path, by name base
        self.scalars = Scalars()
        self.slots: Dict[str, NodeSlots] = {}
        self.errors: Dict[str, List[Optional[torch.Tensor]]] = {}
        # nodes whose results hold their units in another order than the reference's (reordered())
        self.reordered: set = set()
        # the run's float inputs as they came (id -> version): each holds the reference's value of
        # that input (the float32 input is float64's exactly; a cast one is the same cast of it)
        self.entering = {id(t): t._version for t in _input_tensors(run.inputs) if t.is_floating_point()}

    @property
    def diverged_at(self) -> Optional[str]:
        """The reference's node this run did not reach where control flow took another path."""
        return self.missed

    # ------------------------------------------------------------ the walk's questions (measure/sweep.py)

    def observe(self, node, args, kwargs, callee, outs, theirs) -> None:
        slots = self.slots[node.name] = NodeSlots()
        self._received(node.name, outs, slots)
        reads_reordered = self._reads_reordered(args, kwargs)
        if counts_flips(node, self.graph):
            self._flips(node, outs, slots, args, reads_reordered)
        if reads_reordered or reordered(node, outs, theirs):
            self.reordered.add(node.name)
        slots.inputs = self._input_producers(args, kwargs)
        self._local(node, args, kwargs, callee, outs, slots)

    def lines_up(self, node, name: str) -> bool:
        return node.name == name and self.first.fns[name] == node.fn

    def stays_on_path(self, node, args, kwargs, outs: List[torch.Tensor]) -> bool:
        """An op the reference did not run that keeps the value it is given (code that casts or
        clamps only when a value is not float32: T5's ``hidden_states.to(self.wo.weight.dtype)``) or
        only computes a condition: the run stays on the reference's path. Its result stands for its
        operand's reference value, and the names the recorder gives later ops of its kind are
        counted as if it had not run (as_in_first)."""
        floats = [t for t in outs if t.is_floating_point() and t.dim() > 0]
        if floats and node.fn not in _VALUE_KEEPING:
            return False
        if floats:
            operands = [v for v in flatten(args, kwargs)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()]
            source = self.producers.get(operands[0]) if operands and operands[0].shape == floats[0].shape else None
            if source is None or len(floats) != 1:
                return False
            self.producers.alias(floats[0], source)
        base = _name_base(node.fn)
        self.added[base] = self.added.get(base, 0) + 1
        return True

    def as_in_first(self, node):
        """The node under the name the reference gave it: the recorder numbers ops by kind, so each op
        a precision added (stays_on_path) shifts the numbers of the later ones of its kind."""
        base = _name_base(node.fn)
        shift = self.added.get(base)
        if not shift:
            return node
        number = 0 if node.name == base else node.name[len(base) + 1:]
        if number != 0 and not (node.name.startswith(base + "_") and number.isdigit()):
            return node
        number = int(number) - shift
        return dataclasses.replace(node, name=base if number == 0 else f"{base}_{number}")

    def first_value(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """The reference's value of ``t``: of the node output it is, or of the float32 model's tensor
        it copies (a parameter the mode's copy holds)."""
        if self.producers.get(t) is not None:
            return super().first_value(t)
        return self.run.reference_tensors.get(id(t))

    def as_operand(self, v: torch.Tensor, value: torch.Tensor, copy: bool) -> torch.Tensor:
        """The reference's value in the dtype ``v`` has in this mode's run; a shape that differs is
        no replay at all (_Unmatched)."""
        if value.shape != v.shape:
            raise _Unmatched(f"an operand has shape {tuple(v.shape)} here and {tuple(value.shape)} in the reference")
        dtype = self.run.low if id(v) in self.run.low_params else v.dtype
        return value.to(dtype=dtype, copy=copy)

    # ------------------------------------------------------------ helpers

    def _received(self, name: str, outs: List[torch.Tensor], slots: NodeSlots) -> None:
        refs = self.first.values[name]
        for j, (o, r) in enumerate(zip(outs, refs)):
            if not (o.is_floating_point() and r.is_floating_point()):
                continue
            if slots.dtype is None:
                slots.dtype = str(o.dtype).replace("torch.", "")
            if o.shape != r.shape:
                slots.note = f"output {j} has shape {tuple(o.shape)} here and {tuple(r.shape)} in the reference"
                continue
            d = difference(o, r, self.error_dtype, (name, j) in self.first.nonfinite)
            n2, ninf = self.scalars.norms(d)
            slots.received.append((j, n2, ninf))

    def _reads_reordered(self, args, kwargs) -> bool:
        for v in flatten(args, kwargs)[0]:
            if isinstance(v, torch.Tensor):
                source = self.producers.get(v)
                if source is not None and source[0] in self.reordered:
                    return True
        return False

    def _flips(self, node, outs: List[torch.Tensor], slots: NodeSlots, args, reads_reordered: bool = False) -> None:
        refs = self.first.values[node.name]
        for o, r in zip(outs, refs):
            if o.is_floating_point() or r.is_floating_point():
                continue
            changes = self._nms_changes(node, o, r, args) if node.fn in ("nms", "batched_nms") else None
            if changes is None and reads_reordered:
                # Its units arrive in another order than in the reference (an order decision upstream
                # went otherwise, a top-k's ranking of near-tied scores): unit i here is not unit i
                # there, so a count by position would count that reordering as this node's flips.
                slots.note = slots.note or ("decisions not counted: its units arrive in another order than "
                                            "in the reference (an order decided upstream differs)")
                continue
            if changes is None:
                changes = decision_changes(node, o, r)
            if changes is None:  # not comparable (another number of candidates): no figure rather than a wrong one
                continue
            flipped, units = changes
            slots.flips.append((self.scalars.add(torch.as_tensor(flipped)), self.scalars.add(torch.as_tensor(units))))

    def _nms_changes(self, node, kept: torch.Tensor, reference_kept: torch.Tensor, args):
        """An NMS's changed decisions by the boxes it kept (not their indices into its candidates)."""
        boxes = args[0] if args and isinstance(args[0], torch.Tensor) else None
        reference = self.first_value(boxes) if boxes is not None else None
        if reference is None or kept.dim() != 1 or reference_kept.dim() != 1 or boxes.dim() != 2:
            return None
        labels = args[2] if node.fn == "batched_nms" and len(args) > 2 and isinstance(args[2], torch.Tensor) else None
        reference_labels = self.first_value(labels) if labels is not None else None
        if labels is not None and (reference_labels is None or reference_labels.shape[0] != reference.shape[0]):
            labels = reference_labels = None
        return changed_decisions(kept, reference_kept, boxes, reference, labels, reference_labels)

    def _input_producers(self, args, kwargs) -> List[Tuple[str, int]]:
        found = []
        for v in flatten(args, kwargs)[0]:
            if isinstance(v, torch.Tensor) and v.is_floating_point():
                source = self.producers.get(v)
                if source is not None and source not in found:
                    found.append(source)
        return found

    def _exact_args(self, args, kwargs, ref_args, ref_kwargs):
        """Operands for the exact replay: rounded reference values in float32, parameters as the user's."""
        flat, rebuild = flatten(args, kwargs)
        ref_flat, _ = flatten(ref_args, ref_kwargs)
        out = []
        for original, rounded in zip(flat, ref_flat):
            if isinstance(original, torch.Tensor):
                param = self.run.original_tensors.get(id(original))
                if param is not None:
                    out.append(param)
                elif rounded.dtype in REDUCED_FLOATS:
                    out.append(rounded.float())
                else:
                    out.append(rounded)
            else:
                out.append(rounded)
        return rebuild(out)

    def _operands_as_in_reference(self, args, kwargs) -> bool:
        """Whether a call has float operands and every one holds its reference value exactly, known
        without comparing: one of the run's inputs, unchanged since it came in, or a parameter the
        mode's copy shares with the float32 model."""
        floats = 0
        for v in flatten(args, kwargs)[0]:
            if not (isinstance(v, torch.Tensor) and v.is_floating_point()):
                continue
            floats += 1
            if self.entering.get(id(v)) == v._version:
                continue
            if self.run.original_tensors.get(id(v)) is v and id(v) not in self.run.low_params:
                continue
            return False
        return floats > 0

    def _exact_replay(self, args, kwargs, ref_args, ref_kwargs, callee) -> List[torch.Tensor]:
        """The node in float32 on the reference operands as the mode rounded them (the float32 model's
        module and parameters): what its local error is measured against where it reads low-format values."""
        exact_args, exact_kwargs = self._exact_args(args, kwargs, ref_args, ref_kwargs)
        exact_callee = self.run.originals.get(id(callee), callee) if isinstance(callee, torch.nn.Module) else callee
        with self.run.exact_context():
            return tensors(invoke(exact_callee, exact_args, exact_kwargs))

    def _local(self, node, args, kwargs, callee, outs: List[torch.Tensor], slots: NodeSlots) -> None:
        name = node.name
        if not any(t.is_floating_point() for t in outs):
            return
        if node.kind in (Kind.INPUT, Kind.CONSTANT) or (callee is None and node.kind != Kind.SHAPE):
            # A value entering the graph (an input, a parameter read as a value, a constant): its
            # rounding on entry is the only error it adds.
            slots.local_from_received = True
            slots.local = list(slots.received)
            if self.keep_errors:
                refs = self.first.values[name]
                self.errors[name] = [
                    difference(o, refs[j], self.error_dtype, (name, j) in self.first.nonfinite)
                    if o.is_floating_point() and o.shape == refs[j].shape else None
                    for j, o in enumerate(outs)
                ]
            return
        if node.kind in _NO_REPLAY_KINDS:
            slots.local_zero = node.kind == Kind.SHAPE
            return
        if adds_no_rounding(node.fn, args, kwargs, outs):
            slots.local_zero = True
            return
        inplace = is_inplace_call(callee, kwargs)
        try:
            ref_args, ref_kwargs = self.first_operands(args, kwargs, copy=inplace)
            run_args, run_kwargs, decision = self.run.before(node, ref_args, ref_kwargs, callee)
            reduced = any(isinstance(v, torch.Tensor) and v.dtype in REDUCED_FLOATS for v in flatten(ref_args, ref_kwargs)[0])
            exact_callee = self.run.originals.get(id(callee), callee) if isinstance(callee, torch.nn.Module) else callee
            if not inplace and node.fn not in RANDOM_OPS and self._operands_as_in_reference(args, kwargs):
                # every float operand is the reference's value already (the model's inputs, the
                # float32 model's own parameters): the replay would repeat the run's own call
                replayed = outs
                exact = self._exact_replay(args, kwargs, ref_args, ref_kwargs, callee) if reduced else self.first.values[name]
            elif reduced and not inplace and decision is not None and decision.widened_only \
                    and _same_arithmetic(callee, exact_callee):
                # the mode's replay would compute what the exact one does, on the same float32 values
                # (ModeRun.before only widened them): run it once, and store its result as the mode does
                exact_args, exact_kwargs = self._exact_args(args, kwargs, ref_args, ref_kwargs)
                with self.run.exact_context():
                    value = invoke(exact_callee, exact_args, exact_kwargs)
                exact = tensors(value)
                replayed = tensors(self.run.after(value, decision, replay=True))
            else:
                replayed = self.replay(node, ref_args, ref_kwargs, callee, prepared=(run_args, run_kwargs, decision))
                exact = self._exact_replay(args, kwargs, ref_args, ref_kwargs, callee) if reduced else self.first.values[name]
        except _Unmatched as exc:
            slots.note = f"local error not measured: {exc}"
            return
        except Exception as exc:  # a node that cannot be called again on its own: say so, measure the rest
            slots.note = f"local error not measured: replaying the node raised {one_line(exc)}"
            return
        kept: List[Optional[torch.Tensor]] = []
        for j, (y, z) in enumerate(zip(replayed, exact)):
            if not (y.is_floating_point() and z.is_floating_point()) or y.shape != z.shape:
                kept.append(None)
                continue
            e = difference(y, z, self.error_dtype, (name, j) in self.first.nonfinite)
            n2, ninf = self.scalars.norms(e)
            slots.local.append((j, n2, ninf))
            kept.append(e if self.keep_errors else None)
        if self.keep_errors:
            self.errors[name] = kept


def _input_tensors(inputs) -> List[torch.Tensor]:
    return Inputs.of(inputs).tensors()


def _same_arithmetic(callee, exact_callee) -> bool:
    """Whether the mode's copy of a call computes with the float32 model's tensors: the same function,
    or a module copy whose parameters and buffers are the float32 module's own (none rounded)."""
    if callee is exact_callee:
        return True
    if not (isinstance(callee, torch.nn.Module) and isinstance(exact_callee, torch.nn.Module)) \
            or type(callee) is not type(exact_callee):
        return False
    mine = list(callee.parameters()) + list(callee.buffers())
    theirs = list(exact_callee.parameters()) + list(exact_callee.buffers())
    return len(mine) == len(theirs) and all(a is b for a, b in zip(mine, theirs))


ORDER_DECISIONS = ("topk", "sort", "argsort", "msort")


def reordered(node, outs: List[torch.Tensor], refs: List[torch.Tensor]) -> bool:
    """Whether an order decision (top-k, sort) ranked its units otherwise than the reference did: its
    indices differ position by position, even where a top-k chose the same set (which is no flip of
    its own, decision_changes). What is gathered by those indices holds its units in another order."""
    if node.fn not in ORDER_DECISIONS:
        return False
    for o, r in zip(outs, refs):
        if not o.is_floating_point() and not r.is_floating_point() and o.shape == r.shape:
            if bool((o.to(r.device) != r).any()):
                return True
    return False


class Swept:
    """The products of one mode's sweep before they are read back."""

    def __init__(self, observer: SweepObserver, output: Any) -> None:
        self.observer = observer
        self.output = output


def sweep(program: Program, run: ModeRun, ref: ReferenceStore, graph, keep_errors: bool) -> Swept:
    observer = SweepObserver(run, ref, graph, inplace_semantics=not program.is_fx, keep_errors=keep_errors)
    with torch.no_grad(), run.context():
        output = program.run(run.variant, run.inputs, observer)
    return Swept(observer, output)
