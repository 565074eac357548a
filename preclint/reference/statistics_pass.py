"""The reference pass: run the model once in fp32 on the CPU and record what the analyses need.

Per node: statistics of its outputs (absmax, RMS, smallest nonzero magnitude, finiteness, whether the
values are whole numbers); the forward analyses (preclint/reference/analyses/: terms of dot products
and sums, decision margins, ...) see each op's operands and result as it runs; and the gradient
analyses (gains, reach, the gains toward decisions and amplifiers) hear the backward passes they ask
for. The observer here is the runner and the analyses record, as torch.fx's ShapeProp has it: the
interpreter runs, the pass records.

For the backward passes the runner keeps every node's float value as the node made it (the model
may write into it later) and hands an op views of the operands a gradient analysis watches
(``GradientAnalysis.watch``), so that a hook sees the gradient flowing through that op alone (an
activation read by two convs is rounded separately for each). A pass (``BackwardPasses``) calls its
listeners from those hooks; what the gradients mean is the analyses' business (analyses/gains.py
says how one pass gives every node's gain to the output).

The backward passes run only where a gradient analysis asks for them, and values are tracked for
them only when one is among the analyses run.
"""
from __future__ import annotations

import contextlib
import math
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten

from preclint.capture.calls import is_inplace_call
from preclint.core.errors import one_line
from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node, TensorStats
from preclint.core.notes import Note
from preclint.load.modelio import output_tensors
from preclint.core.numerics import FP16
from preclint.capture.observer import Call, Observer
from preclint.reference.poison import PoisonTracker
from preclint.reference.backward_passes import BackwardPasses, Pass, backward_for_hooks
from preclint.reference.saved_values import SavedValues
from preclint.reference.tied_weights import TiedWeights, held_as
from preclint.reference.value_stats import tensor_stats
from preclint.reference.analyses import direction_like
from preclint.capture.trees import flatten


def hook_gradient(t: torch.Tensor, fn) -> Any:
    """``t.register_hook(fn)``, safe for views.

    A view whose base was modified in place since the view was made (``y = x.view(...)``, then
    ``y[:, 0] = 0`` or an in-place op on ``x``) has a stale ``grad_fn`` that autograd regenerates
    when it is read; ``register_hook`` reaches for the stale one and crashes the process
    (SIGSEGV, torch 2.4-2.14). Reading ``grad_fn`` first regenerates it."""
    t.grad_fn  # noqa: B018 - read for its side effect
    return t.register_hook(fn)


def carries_error(node: Node, args, output):
    """What a ``detach`` returns, for the backward passes: the value it detaches, still attached.

    ``detach`` stops gradients, not errors: the rounding upstream of it reaches everything computed
    from its result (RAFT's refined coordinates, detached before each iteration reads them, carry
    every earlier iteration's error on). Gradients that stopped there would weigh that error by the
    last iteration alone. The model goes on with a view of the same value, which autograd follows;
    a leaf (a parameter, an input) keeps its own detached copy, since a view of a leaf that requires
    gradients cannot be written in place as the model may write its detached result."""
    if node.fn != "detach" or not args or not isinstance(output, torch.Tensor) or not torch.is_grad_enabled():
        return output
    source = args[0]
    if not (isinstance(source, torch.Tensor) and source.is_floating_point() and source.requires_grad
            and not source.is_leaf):
        return output
    return source.view_as(source)


def _storage_key(t: torch.Tensor) -> Optional[Tuple[int, torch.device]]:
    """What tensors that share memory have in common (a view and its base, two views of one buffer)."""
    try:
        return t.untyped_storage().data_ptr(), t.device
    except (RuntimeError, NotImplementedError, TypeError):  # tensors without storage (subclasses, meta)
        return None


class _Watched:
    """A tensor whose gradient the backward passes weigh, as it was when the forward pass made it.

    The model may write into the tensor later (``y[:, 0] = 0``, an in-place activation on it or on a
    view of it). A hook registered when the tensor is made sees the gradient of that version (one
    registered after the write would see the next version's); ``snapshot`` keeps its values from
    before a write that the observer sees coming, and a write it did not see leaves ``value()`` None
    rather than the wrong values."""

    __slots__ = ("tensor", "version", "snapshot", "rectified")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.snapshot: Optional[torch.Tensor] = None
        self.rectified = False  # written by an in-place ReLU (see ReferenceObserver._rectify)
        if tensor.is_inference():
            # a tensor made in inference_mode has no version counter: nothing would tell a later
            # write, so its values are kept now and it counts as possibly changed (no gradient either)
            self.version: Optional[int] = None
            self.snapshot = tensor.detach().clone()
        else:
            self.version = tensor._version

    @property
    def changed(self) -> bool:
        return self.version is None or self.tensor._version != self.version

    def value(self) -> Optional[torch.Tensor]:
        if self.snapshot is not None:
            return self.snapshot
        return None if self.changed else self.tensor.detach()


# Operands autograd refuses to differentiate (a batch norm's running statistics, read by F.batch_norm
# in modules FX looks into): the model gets them without gradient. fn -> positions in
# torch.nn.functional's signature, positions in torch's (weight and bias come first there), keywords.
_NO_GRADIENT_OPERANDS = {
    "batch_norm": ((1, 2), (3, 4), ("running_mean", "running_var")),
    "instance_norm": ((1, 2), (3, 4), ("running_mean", "running_var")),
}


# Ops that, written in place, zero the gradient wherever they change a value (see _rectify).
_RECTIFIERS = frozenset({"relu", "relu_"})


class ReferenceObserver(Observer):
    """The observer handed to capture: records statistics as each node runs.

    ``before`` may hand the op views of its operands, so that a gradient hook sees the gradient that
    flows through this op alone (an activation read by two convs is rounded separately for each).

    Whatever goes wrong in preclint's own statistics of a node costs that node's statistics (and a
    note), never the run of the model.
    """

    def __init__(self, analyses: Sequence[Any] = (), with_sensitivity: bool = True) -> None:
        """``analyses``: instances of the analyses to run (preclint.reference.analyses), in dependency order;
        the backward passes are prepared only when one of them needs gradients and ``with_sensitivity``."""
        self.analyses = tuple(analyses)
        # (the reference pass sits below the analyses: it knows them by what they do, not their classes)
        self.forward = [a for a in self.analyses if hasattr(a, "observe")]
        self.gradient = [a for a in self.analyses if a.gradients]
        self.with_sensitivity = with_sensitivity and bool(self.gradient)
        self.by_id: Dict[int, Tuple[TensorStats, torch.Tensor]] = {}
        self.values: Dict[str, torch.Tensor] = {}  # node name -> float output kept for the backward passes
        self.watched: Dict[str, _Watched] = {}  # node name -> its value as the node made it
        self.operands: Dict[str, List[_Watched]] = {}  # node name -> operand views / weights it rounds
        self.by_storage: Dict[Any, List[_Watched]] = {}  # what an in-place write may change
        self.saved = SavedValues()  # what autograd saved, kept from in-place writes (saved_values.py)
        # id of a value an op has read (kept alive by by_id) -> its version then: a value an in-place op
        # wrote since (``out += identity`` before the ReLU) was not read as it is now
        self.read: Dict[int, int] = {}
        self.view_origin: Dict[int, torch.Tensor] = {}  # id of an operand view -> the tensor it views
        self.producers: Dict[int, str] = {}  # id of a value the run made (kept alive by by_id) -> its node
        self.operand_sources: Dict[int, Optional[str]] = {}  # id of an operand view -> the node that made its value
        self.handles: List[Any] = []  # hooks on values made during the run
        self._listeners: Optional[Tuple[Any, ...]] = None  # set during a backward pass, see backward
        self._unknown: set = set()  # values of that pass written in place where the observer could not see it
        self.first_nonfinite: Optional[str] = None
        self.masked: set = set()  # nodes whose infinities are intended (masks), not a failure
        self.constant_leaves: List[torch.Tensor] = []  # float values made from constants, see _as_leaf
        self.computed_weights: List[torch.Tensor] = []  # weights computed in forward: the backward passes ask for them
        self.tied = TiedWeights()  # a weight two readers share gets a view per dot product (tied_weights.py)
        self.constant_names: set = set()  # nodes whose value is a constant, rounded with known errors
        self.input_names: List[str] = []
        self.input_leaves: Dict[str, torch.Tensor] = {}  # input name -> the leaf its copy was made from
        self.failures: List[str] = []  # "node: error" of statistics that could not be computed
        self.poison = PoisonTracker(self.origin)  # integer elements computed from inf or NaN
        self.large: set = set()  # nodes with values beyond float16's range (analyses/reach.py)
        self.on_node: Callable[[], None] = lambda: None  # called once a node ran (a progress bar)

    def reset(self) -> bool:
        """Forget a run that failed part-way, for another run from the start."""
        self.tied.give_back()
        for h in self.handles:
            h.remove()
        on_node, saved = self.on_node, self.saved
        self.__init__(self.analyses, self.with_sensitivity)
        self.on_node = on_node
        self.saved = saved  # (the run that follows saves through it: saving() holds its hooks)
        saved.clear()
        return True

    def saving(self):
        """The context the model runs in: autograd saves its values through ``saved`` (saved_values.py)."""
        return self.saved.saving() if self.with_sensitivity else contextlib.nullcontext()

    def _intended_infinity(self, node: Node, outputs: List[torch.Tensor]) -> bool:
        """Infinities a model puts there on purpose: a fill with an infinite constant (a -inf mask),
        or an op that passes such a mask on (scores + mask). NaN never is."""
        if any(t.is_floating_point() and bool(torch.isnan(t).any()) for t in outputs):
            return False
        if any(math.isinf(v) for v in node.scalars.values()):
            return True
        return any(name in self.masked for name in node.inputs)

    def rename(self, node: Node, name: str) -> None:
        """The function-mode recorder names a node only after it ran; move what before() kept."""
        if node is not None and node.name in self.operands:
            self.operands[name] = self.operands.pop(node.name)

    def origin(self, tensor):
        """The tensor an operand view made by before() stands for (the tensor itself otherwise)."""
        return self.view_origin.get(id(tensor), tensor)

    def _failed(self, node: Node, what: str, exc: Exception) -> None:
        self.failures.append(f"{node.name or node.fn} ({what}): {one_line(exc)}")

    # ------------------------------------------------------------------ values as they were made

    def _watch(self, tensor: torch.Tensor) -> _Watched:
        entry = _Watched(tensor)
        key = _storage_key(tensor)
        if key is not None:
            self.by_storage.setdefault(key, []).append(entry)
        return entry

    def _protect(self, target, rectifies: bool = False) -> None:
        """Keep the values of every watched tensor that a write into ``target`` is about to change;
        with ``rectifies`` (an in-place ReLU), ``target``'s own entry keeps none (``_rectify``)."""
        if not isinstance(target, torch.Tensor):
            return
        self.saved.protect(target)
        for entry in self.by_storage.get(_storage_key(target), ()):
            if entry.snapshot is None and not entry.changed:
                if rectifies and entry.tensor is target and self.read.get(id(target)) != target._version:
                    self._rectify(entry)
                else:
                    entry.snapshot = entry.tensor.detach().clone()

    @staticmethod
    def _rectify(entry: _Watched) -> None:
        """An in-place ReLU about to write ``entry``'s tensor, which no op read before: its values after
        the write serve the backward passes as well as those before, so none are copied. The only
        gradient that reaches the values before the write comes through the ReLU, which is zero wherever
        it changed a value (where z <= 0), so grad * relu(z) == grad * z element for element (and the
        value where grad != 0 is the same): the gains' sums, and the largest value reached, are
        unchanged. A conv's output in a ResNet is rectified this way in every block, and copying it
        held as much memory again as the activations themselves. (A root of a pass it is no longer:
        ``rectified``.)"""
        entry.version = entry.tensor._version + 1  # the write to come
        entry.rectified = True

    def _on_value_grad(self, name: str, entry: _Watched, grad: Optional[torch.Tensor]) -> None:
        listeners = self._listeners
        if listeners is None or grad is None:  # a backward pass of the model's own, or nothing to weigh
            return
        value = entry.value()
        if value is None:
            self._unknown.add(name)
            return
        for listener in listeners:
            listener.on_grad(name, value, grad)

    def _on_operand_grad(self, entry: _Watched, grad: Optional[torch.Tensor]) -> None:
        listeners = self._listeners
        if listeners is None or grad is None:
            return
        value = entry.value()
        if value is not None:
            for listener in listeners:
                listener.on_operand_grad(entry, value, grad)

    # ------------------------------------------------------------------ observer protocol

    def before(self, node: Node, args, kwargs, callee):
        if not self.with_sensitivity:
            return args, kwargs
        try:
            return self._before(node, args, kwargs, callee)
        except Exception as exc:  # noqa: BLE001 - the model runs on with its own operands
            self._failed(node, "operand views", exc)
            return args, kwargs

    def _operand_view(self, node: Node, v: torch.Tensor, *, weight: bool,
                      source: Optional[str]) -> Tuple[torch.Tensor, _Watched]:
        """A view of operand ``v`` for this call alone, whose hook hears the gradient that flows through this
        op only; ``source``: the node that made ``v`` (None for a weight); ``weight``: a conv's or linear's
        weight, which the backward passes then ask for (computed in forward, or tied: no leaf of the
        passes reaches its view otherwise)."""
        view = v.view_as(v)
        entry = self._watch(view)
        self.operand_sources[id(entry)] = source
        self.handles.append(hook_gradient(view, partial(self._on_operand_grad, entry)))
        # a view of a view has the root as its _base; remember which tensor this one stands for
        self.view_origin[id(view)] = v
        if weight and node.kind in (Kind.CONV, Kind.LINEAR):
            self.computed_weights.append(view)
        return view, entry

    def _before(self, node: Node, args, kwargs, callee):
        self.tied.note(node.fn, args, kwargs, callee)
        inplace = is_inplace_call(callee, kwargs)
        if inplace and args:
            self._protect(args[0], rectifies=node.fn in _RECTIFIERS)
        for v in (*args, *kwargs.values()):
            if isinstance(v, torch.Tensor):
                read = self.origin(v)
                self.read[id(read)] = read._version
        if isinstance(kwargs.get("out"), torch.Tensor):
            self._protect(kwargs["out"])
        if node.fn in _NO_GRADIENT_OPERANDS:
            functional, native, keywords = _NO_GRADIENT_OPERANDS[node.fn]
            positions = functional if getattr(callee, "__module__", "") == "torch.nn.functional" else native
            detach = lambda v: v.detach() if isinstance(v, torch.Tensor) and v.requires_grad else v  # noqa: E731
            args = tuple(detach(a) if i in positions else a for i, a in enumerate(args))
            kwargs = {k: detach(v) if k in keywords else v for k, v in kwargs.items()}
        dtype = kwargs.get("dtype")
        if isinstance(dtype, torch.dtype) and not (dtype.is_floating_point or dtype.is_complex):
            # an integer result (cumsum(counts, dtype=torch.int32) in transformers' MoE experts) has no
            # gradient, and autograd refuses to record the op on operands that require one: they go
            # without (a constant the backward passes made a leaf of, an activation)
            detach = lambda v: v.detach() if isinstance(v, torch.Tensor) and v.requires_grad else v  # noqa: E731
            return tuple(detach(a) for a in args), {k: detach(v) for k, v in kwargs.items()}
        wanted = [t for analysis in self.gradient for t in analysis.watch(node, Call(args, kwargs, callee, []))]
        if not wanted:
            return args, kwargs
        chosen = {id(t) for t in wanted}
        operands = {id(v) for v in (*args, *kwargs.values())}
        views: List[_Watched] = []

        def as_view(v, position=None):
            if isinstance(v, torch.Tensor) and id(v) in chosen and v.is_floating_point() and v.requires_grad:
                if v.is_leaf and node.kind in DOT_PRODUCT_KINDS and self.tied.tied(v):
                    view, entry = self._operand_view(node, v, weight=True, source=None)
                    views.append(entry)
                    return view
                if v.is_leaf:  # a weight passed as an argument: hook the parameter itself
                    views.append(_Watched(v))
                    return v
                if inplace and position == 0:
                    # the op writes into it: a view of it would lose its history to the write (autograd
                    # routes the gradient around the view), so the op gets the tensor itself
                    return v
                view, entry = self._operand_view(node, v, weight=position in (1, "weight"),
                                                 source=self.producers.get(id(v)))
                views.append(entry)
                return view
            return v

        args = tuple(as_view(a, i) for i, a in enumerate(args))
        kwargs = {k: as_view(v, k if node.kind in (Kind.CONV, Kind.LINEAR) else None) for k, v in kwargs.items()}
        # what is watched beyond the operands: weights the callee holds, hooked as they are
        for weight in {id(t): t for t in wanted if id(t) not in operands}.values():
            if isinstance(weight, torch.Tensor) and weight.requires_grad and weight.is_leaf:
                if node.kind in DOT_PRODUCT_KINDS and self.tied.tied(weight) and held_as(callee, weight):
                    view, entry = self._operand_view(node, weight, weight=True, source=None)
                    self.tied.lend(callee, weight, view)  # (given back once the call ran, see __call__)
                    views.append(entry)
                    continue
                views.append(_Watched(weight))
        if views:
            self.operands[node.name] = views
        return args, kwargs

    def __call__(self, node: Node, args, kwargs, callee, output):
        self.tied.give_back()
        self.on_node()
        if self.with_sensitivity:
            output = carries_error(node, args, output)
        try:
            self._record(node, args, kwargs, callee, output)
        except Exception as exc:  # noqa: BLE001 - this node's statistics are lost, not the run
            self._failed(node, "statistics", exc)
        if self.with_sensitivity:
            try:
                output = self._track(node, output)
            except Exception as exc:  # noqa: BLE001
                self._failed(node, "gradient hooks", exc)
        try:
            self.poison.observe(node, args, kwargs, callee, output_tensors(output))
        except Exception as exc:  # noqa: BLE001
            self._failed(node, "masked values", exc)
        if node.outputs and node.outputs[0].is_float and node.outputs[0].absmax > FP16.max_finite:
            self.large.add(node.name)
        return output

    def _record(self, node: Node, args, kwargs, callee, output) -> None:
        node.input_stats = []
        for v in flatten(args, kwargs)[0]:
            if isinstance(v, torch.Tensor):
                known = self.by_id.get(id(self.origin(v)))
                node.input_stats.append(known[0] if known is not None else tensor_stats(v))
        outputs = output_tensors(output)
        node.outputs = [tensor_stats(t) for t in outputs]
        for t, s in zip(outputs, node.outputs):
            self.by_id[id(t)] = (s, t)
            self.producers[id(t)] = node.name
        if any(s.is_float and not s.finite for s in node.outputs):
            if self._intended_infinity(node, outputs):
                self.masked.add(node.name)
            elif self.first_nonfinite is None:
                self.first_nonfinite = node.name
        call = Call(args, kwargs, callee, outputs)
        with torch.no_grad():
            for analysis in self.forward:
                try:
                    analysis.observe(node, call)
                except Exception as exc:  # noqa: BLE001 - this statistic of this node is lost, not the others
                    self._failed(node, "statistics", exc)

    def _track(self, node: Node, output):
        """Watch the node's float value for the backward passes (a constant becomes a leaf first)."""
        outputs = output_tensors(output)  # (as _record took the node's statistics)
        # (not scalars: models turn them into Python numbers with .item(), which warns on a leaf;
        # nor values the model computes under no_grad, where it wants no gradient)
        if (isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel() > 1
                and not output.requires_grad and torch.is_grad_enabled() and node.kind not in (Kind.OUTPUT, Kind.SHAPE)):
            output = self._as_leaf(output)
            outputs = [output]
            self.producers[id(output)] = node.name
            self.constant_names.add(node.name)
        elif node.fn == "parameter":
            self.constant_names.add(node.name)
        elif (node.kind == Kind.INPUT and len(outputs) == 1 and outputs[0].is_leaf and outputs[0].requires_grad
              and isinstance(output, (torch.Tensor, list))):
            # (the function-mode recorder hands an input over as a list of its one tensor)
            outputs = [self._input_copy(node.name, outputs[0])]
            output = outputs[0] if isinstance(output, torch.Tensor) else outputs
        if outputs and outputs[0].is_floating_point() and outputs[0].requires_grad:
            value = outputs[0]
            self.values[node.name] = value
            entry = self.watched[node.name] = self._watch(value)
            if not value.is_leaf:  # leaves (inputs, parameters) are hooked per pass, see backward
                self.handles.append(hook_gradient(value, partial(self._on_value_grad, node.name, entry)))
            if node.kind == Kind.INPUT:
                self.input_names.append(node.name)
        return output

    def _nonfinite_reaches(self, graph: Graph, output: Any) -> bool:
        """Whether the inf or NaN of the reference run reach the model's output: as infinities the
        output holds (other than intended masks), or through integers computed from them."""
        values = [v for v in tree_flatten(output)[0] if isinstance(v, torch.Tensor)]
        if any(self.poison.mask(v) is not None for v in values):
            return True
        for out in graph.output_nodes:
            for name in out.inputs:
                node = graph.get(name)
                if node is not None and name not in self.masked and any(s.is_float and not s.finite for s in node.outputs):
                    return True
        return False

    def _input_copy(self, name: str, leaf: torch.Tensor) -> torch.Tensor:
        """The model gets a copy of an input that requires gradients, which it may write in place (a
        recurrent state the caller passes, stored into step by step, as transformers' RWKV stores its
        own); autograd refuses a write into the leaf itself, and the whole pass went without gradients.
        The backward passes still reach back to the leaf (``input_leaves``)."""
        self.input_leaves[name] = leaf
        with torch.enable_grad():
            copy = leaf.clone()
        self.by_id[id(copy)] = self.by_id.get(id(leaf), (tensor_stats(leaf), leaf))
        self.producers[id(copy)] = name
        return copy

    def _as_leaf(self, value: torch.Tensor) -> torch.Tensor:
        """A float value made from constants (a position table from arange, a buffer) has no gradient,
        so nothing would say how its rounding reaches the output: make it a leaf of the backward pass.
        The model gets a copy, which it may modify in place as it could the original."""
        leaf = value.detach().requires_grad_(True)
        self.constant_leaves.append(leaf)
        with torch.enable_grad():
            copy = leaf.clone()
        self.by_id[id(copy)] = self.by_id.get(id(value), (tensor_stats(value), value))
        return copy

    # ------------------------------------------------------------------ backward passes

    def backward(self, roots: List[torch.Tensor], listeners: Sequence[Any], *, seed: int, probes: int,
                 cotangents: Optional[List[torch.Tensor]] = None) -> "Pass":
        """Backward passes from ``roots`` whose gradients ``listeners`` hear: ``probes`` of them along
        random directions v ~ N(0, I) drawn with ``seed``, or one along ``cotangents``."""
        handles = []
        # Leaves (inputs, weights, parameters read as values) are hooked for the pass only: they
        # belong to the user's model and cannot be written in place while they require gradients.
        for name, entry in self.watched.items():
            if entry.tensor.is_leaf:
                handles.append(entry.tensor.register_hook(partial(self._on_value_grad, name, entry)))
        weights: Dict[int, torch.Tensor] = {}
        for entries in self.operands.values():
            for entry in entries:
                if entry.tensor.is_leaf:
                    handles.append(entry.tensor.register_hook(partial(self._on_operand_grad, entry)))
                    weights[id(entry.tensor)] = entry.tensor
        # Asking only for the inputs' and weights' gradients keeps memory flat; the hooks still see
        # every value on the way. Models without float inputs (token ids) ask for all values instead.
        leaves = [self.input_leaves.get(n, self.values[n]) for n in self.input_names] or list(self.values.values())
        leaves = leaves + list(weights.values()) + self.constant_leaves + self.computed_weights
        generator = torch.Generator().manual_seed(seed)
        directions = probes if cotangents is None else 1
        self._listeners, self._unknown = tuple(listeners), set()
        try:
            for _ in range(directions):
                vs = cotangents or [direction_like(r, generator) for r in roots]
                backward_for_hooks(roots, leaves, vs)
            unknown = frozenset(self._unknown)
        finally:
            self._listeners = None
            for h in handles:
                h.remove()
        return Pass(sum(r.numel() for r in roots) * directions, unknown)

    def finish(self, graph: Graph, output: Any) -> None:
        """The gradient analyses' backward passes (each node's gains to the output, and to the input of
        each risky decision or rounding to integers), then let go of every value kept."""
        self.tied.give_back()  # (a call that raised gave none back)
        try:
            if self.first_nonfinite is not None and not self._nonfinite_reaches(graph, output):
                self.first_nonfinite = None  # inf or NaN at elements the model discards before its output
            self.poison.clear()
            self._forward_done()
            if self.with_sensitivity:
                self._backward_passes(graph, output)
        finally:
            if self.failures:
                shown = "; ".join(self.failures[:2]) + (f" and {len(self.failures) - 2} more" if len(self.failures) > 2 else "")
                graph.notes.append(Note("reference", f"statistics of {len(self.failures)} node(s) could not be recorded "
                                                     f"({shown})"))
            for h in self.handles:
                h.remove()
            self.handles.clear()
            self.values.clear()
            self.watched.clear()
            self.operands.clear()
            self.by_storage.clear()
            self.read.clear()
            self.view_origin.clear()
            self.by_id.clear()
            self.producers.clear()
            self.operand_sources.clear()
            self.constant_leaves.clear()
            self.input_leaves.clear()
            self.computed_weights.clear()
            self.saved.clear()

    def _forward_done(self) -> None:
        """Let go of what only the forward pass reads (statistics by tensor, versions read, producers,
        views' origins): they hold every value the run made, and the backward passes that follow need
        only those in ``values``, ``watched`` and ``operands``. A value nothing else holds (an integer
        index, a float the model computed without gradient) is freed before the passes add their own
        gradients to the peak."""
        self.by_id.clear()
        self.read.clear()
        self.producers.clear()
        self.view_origin.clear()

    def _backward_passes(self, graph: Graph, output: Any) -> None:
        passes = BackwardPasses(self, graph, output)
        # (those that read the passes from the outputs first, as they ran before there were analyses:
        # a decision's pass that fails costs the gains nothing)
        gradient = sorted(self.gradient, key=lambda a: bool(a.needs))
        try:
            for analysis in gradient:
                analysis.finish(graph, passes)
        except Exception as exc:  # noqa: BLE001 - an op without a derivative: predictions fall back to no amplification
            text = str(exc).strip().splitlines()
            graph.notes.append(Note("reference", "error propagation estimated without gradients "
                                                 f"({text[0] if text else type(exc).__name__})"))


def param_stats(module: torch.nn.Module) -> Dict[str, TensorStats]:
    stats = {}
    for name, p in list(module.named_parameters()) + list(module.named_buffers()):
        stats[name] = tensor_stats(p)
    return stats
