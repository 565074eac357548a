"""One walk over two settings: a second run followed node by node beside a first one recorded before it.

The second run is this observer's prepared mode (measure/runners.py's ApplyMode applies its
arithmetic), observed and never altered unless a subclass steers it. At each node that lines up with
the first run's (the same name at the same place in the run), the walk hands ``observe`` the node's
value and the first run's value of it; ``first_operands`` and ``replay`` call the node again in the
second setting on the first run's operands, which tells what the node itself changes from what it
received. Where the runs stop lining up (control flow took another branch), nothing after is compared.

Two passes are this walk with their own observation:

* the probe's sweep (probe/sweep.py): first = the float64 run; received and local error per node;
* diff's parting (diff/parting.py): first = setting A's run; difference and contributed per node.

A walk with no first run records one (``RecordedRun``), for a later walk to follow. What both
observations ask alike is here too: whether a call adds no rounding of its own (``adds_no_rounding``,
from core/exact_ops.py's one table: such a node is not replayed) and how many units of a decision
changed (``decision_changes``).
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.capture.calls import scalar_args
from preclint.capture.trees import flatten
from preclint.core.exact_ops import exact_in_dtype
from preclint.core.ir import Kind
from preclint.measure.execute import Producers, invoke, tensors
from preclint.measure.runners import ApplyMode


class RecordedRun:
    """A run's values node by node: the names in the order they ran, each node's output tensors, and
    the run's output. (The probe's float64 run, probe/reference_pass.ReferenceStore, keeps the same
    ``order`` and ``values``, and is followed the same way.)"""

    def __init__(self) -> None:
        self.order: List[str] = []
        self.values: Dict[str, List[torch.Tensor]] = {}
        self.output: Any = None


class Sweep(ApplyMode):
    """The run of ``run`` (a prepared mode) followed beside ``first`` (None: recorded, into ``record``).

    A subclass says what it measures at a node that lines up (``observe``) and may override how a
    node is matched (``as_in_first``, ``lines_up``, ``stays_on_path``), which output the run goes on
    with (``steer``) and how a first run's value takes an operand's place (``as_operand``)."""

    def __init__(self, run, first=None, inplace_semantics: bool = False) -> None:
        super().__init__(run, inplace_semantics)
        self.first = first
        self.record: Optional[RecordedRun] = RecordedRun() if first is None else None
        self.producers = Producers()
        self.position = 0  # how many of the first run's nodes this run has met, in order
        self.left_at: Optional[str] = None  # this run's node where it left the first run's path
        self.missed: Optional[str] = None  # the first run's node it did not reach there

    def __call__(self, node, args, kwargs, callee, output):
        pending, self.pending = self.pending, None
        decision = None
        if self.pending_for(pending, node):
            args, kwargs, decision = pending[1], pending[2], pending[3]  # the operands as they came
        output = self.run.entering(node, self.run.after(output, decision))
        if node.kind == Kind.OUTPUT:
            return output
        node = self.as_in_first(node)
        theirs = self._theirs(node)
        if theirs is None and self.first is not None and self.left_at is None:
            if self.stays_on_path(node, args, kwargs, tensors(output)):
                return output
            order = self.first.order
            self.missed = order[self.position] if self.position < len(order) else node.name
            self.left_at = node.name
        if theirs is not None:
            output = self.steer(node, output, theirs, args, kwargs)
        outs = tensors(output)
        if theirs is not None:
            self.observe(node, args, kwargs, callee, outs, theirs)
        if self.record is not None:
            self.record.order.append(node.name)
            self.record.values[node.name] = [t.detach() for t in outs]
        # after observe: an in-place op returns its operand, which must still name the node that made it
        self.producers.add(node.name, outs)
        return output

    def _theirs(self, node) -> Optional[List[torch.Tensor]]:
        """The first run's outputs of ``node`` where it lines up (and the walk moves on), else None."""
        if self.first is None or self.left_at is not None:
            return None
        order = self.first.order
        if self.position < len(order) and self.lines_up(node, order[self.position]):
            self.position += 1
            return self.first.values[node.name]
        return None

    # ------------------------------------------------------------ what a subclass may say

    def as_in_first(self, node):
        """``node`` under the name the first run gave it (by default its own)."""
        return node

    def lines_up(self, node, name: str) -> bool:
        """Whether ``node`` is the first run's node ``name``, the next it ran."""
        return node.name == name

    def stays_on_path(self, node, args, kwargs, outs: List[torch.Tensor]) -> bool:
        """Whether a node the first run did not run leaves the runs lined up (by default never)."""
        return False

    def steer(self, node, output, theirs: List[torch.Tensor], args, kwargs):
        """The output this run goes on with at a node that lines up (by default its own)."""
        return output

    def observe(self, node, args, kwargs, callee, outs: List[torch.Tensor], theirs: List[torch.Tensor]) -> None:
        """What is measured at a node that lines up: ``outs`` this run's, ``theirs`` the first run's."""

    # ------------------------------------------------------------ the node on the first run's operands

    def first_value(self, t: torch.Tensor) -> Optional[torch.Tensor]:
        """The first run's value of this run's tensor ``t``: that of the node output it is."""
        source = self.producers.get(t)
        if source is None or self.first is None:
            return None
        values = self.first.values.get(source[0])
        return values[source[1]] if values is not None and source[1] < len(values) else None

    def as_operand(self, v: torch.Tensor, value: torch.Tensor, copy: bool) -> torch.Tensor:
        """The first run's ``value`` in the place of operand ``v``, as this run holds ``v`` (device,
        dtype); ``v`` itself where the shapes differ."""
        if value.shape != v.shape:
            return v
        return value.to(device=v.device, dtype=v.dtype, copy=copy)

    def first_operands(self, args, kwargs, copy: bool = False):
        """The call's operands with the first run's values where it has them (``copy``: never the
        first run's own tensors, for a call that writes its operand)."""
        flat, rebuild = flatten(args, kwargs)
        out = []
        for v in flat:
            if isinstance(v, torch.Tensor):
                value = self.first_value(v)
                if value is not None:
                    v = self.as_operand(v, value, copy)
            out.append(v)
        return rebuild(out)

    def replay(self, node, args, kwargs, callee, prepared=None) -> List[torch.Tensor]:
        """The node called again in this run's setting on ``args, kwargs`` (first_operands'), its
        result as the mode stores it; ``prepared``: what ``run.before`` made of them already."""
        run_args, run_kwargs, decision = prepared if prepared is not None else self.run.before(node, args, kwargs, callee)
        return tensors(self.run.after(invoke(callee, run_args, run_kwargs), decision, replay=True))


def adds_no_rounding(fn: str, args, kwargs, outs: List[torch.Tensor]) -> bool:
    """Whether an ``fn`` call adds no error of its own: an op exact in its operand's dtype
    (core/exact_ops.py; its scalar constants held by that dtype) whose float results keep the dtype
    of its (first) float operand. Such a call is not replayed: a replay would show only the rounding
    of its operand, which the node that produced the operand owns."""
    first = next((v for v in flatten(args, kwargs)[0] if isinstance(v, torch.Tensor) and v.is_floating_point()), None)
    if first is None or any(t.dtype != first.dtype for t in outs if t.is_floating_point()):
        return False
    return exact_in_dtype(fn, scalar_args(args, kwargs, skip_first=True).values(), first.dtype)


def decision_changes(node, value: torch.Tensor, reference: torch.Tensor) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """(units whose decision changed, units) for an integer/boolean result of a decision (None when the
    two results cannot be compared unit by unit).

    Units are what PCL301 counts: elements for thresholds and argmax, rows for top-k and sort
    (a row changes when its index set or order does), and for variable-length results (NMS) the
    union of the kept indices, of which the symmetric difference changed (the probe's sweep compares
    an NMS by the boxes it kept where it knows them: detections.changed_decisions).
    """
    device = reference.device
    value = value.to(device)
    fn = node.fn
    if fn in ("nms", "batched_nms", "unique", "nonzero") and value.dim() == 1 and reference.dim() == 1:
        a, b = value.long(), reference.long()
        missing = (~torch.isin(b, a)).sum()
        extra = (~torch.isin(a, b)).sum()
        return missing + extra, torch.as_tensor(reference.numel(), device=device) + extra
    if value.shape != reference.shape:
        # a mask or a ranking over another number of candidates: the units of the two runs do not
        # correspond, so no count of flips would be a measurement
        return None
    if value.numel() == 0:
        zero = torch.zeros((), device=device)
        return zero, zero
    dim = node.attrs.get("dim", -1)
    if fn in ("topk", "sort", "argsort", "msort") and value.dim() > 0 and isinstance(dim, int):
        a, b = value, reference
        if fn == "topk":  # the set of the top k, whatever their order
            a, b = a.sort(dim=dim).values, b.sort(dim=dim).values
        changed = (a != b).any(dim=dim)
        return changed.sum(), torch.as_tensor(changed.numel(), device=device)
    changed = value != reference
    return changed.sum(), torch.as_tensor(changed.numel(), device=device)
