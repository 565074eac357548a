"""The reference pass: run the model once in fp32 on the CPU and record what the analyses need.

Per node: statistics of its outputs (absmax, RMS, smallest nonzero magnitude, finiteness, whether the
values are whole numbers); the forward analyses (preclint/analyses/: terms of dot products and sums,
decision margins, ...) see each op's operands and result as it runs; and the backward passes show the
gradient analyses how rounding at each node reaches the output.

That last part uses one backward pass with a random output cotangent v ~ N(0, I). A relative rounding
error delta (RMS r, independent per element) of a value z moves v.output by sum_j g_j z_j delta_j,
where g = J^T v is z's gradient; its expected square over v and delta is r^2 sum_j (g_j z_j)^2. So
one pass gives, for every node at once, the gain of rounding its result (``Gains.out`` of ir.py) and of
rounding its operands (``Gains.operands``: the activation a conv or matmul reads, and its weight).
Weights are rounded once for all output positions, so their error is coherent across the output;
weighting by the weight gradient accounts for that where a per-element model would not.

Other ops that compute values get views of their float operands too (``Gains.inputs``, and per input
node ``Gains.by_input``): the ratio inputs / out is how much the op amplifies a relative error that
arrives at its inputs, the relative condition number of the op weighted by what reaches the output.
An operand spread over many outputs (an SE gate broadcast over the image, a bias table gathered into
an attention map, coordinates sampling a correlation volume) sums the gradients of all the outputs
it reaches; where those agree in sign (a pooling after it), its gain grows with their number R
though no output element's relative error does. The ratio is per output element: such an operand's
gain is divided by R, the outputs per operand element.

The backward passes run only where a gradient analysis asks for them (BackwardPasses), and values
are tracked for them only when one is among the analyses run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.utils._pytree import tree_flatten

from preclint.capture.graph import is_inplace_call
from preclint.core.errors import one_line
from preclint.core.ir import DOT_PRODUCT_KINDS, Graph, Kind, Node, TensorStats
from preclint.load.modelio import output_tensors
from preclint.core.numerics import FP16
from preclint.capture.observer import Call, Observer
from preclint.reference.poison import PoisonTracker
from preclint.capture.trees import flatten


# Ops whose operands get views so that their amplification of incoming error can be read off the
# gradients (shape ops move values and amplify nothing; decisions and comparisons are judged by margins).
AMPLIFYING_KINDS = frozenset({Kind.ELEMENTWISE, Kind.ACTIVATION, Kind.SOFTMAX, Kind.NORM, Kind.REDUCTION,
                              Kind.SCAN, Kind.POOL, Kind.RESAMPLE, Kind.BATCHNORM})


def tensor_stats(t: torch.Tensor) -> TensorStats:
    dtype = str(t.dtype).replace("torch.", "")
    shape = tuple(t.shape)
    if t.numel() == 0:
        return TensorStats(shape, dtype, 0)
    with torch.no_grad():
        x = t.detach()
        if not (x.is_floating_point() or x.is_complex()):
            a = x.abs().to(torch.float64) if x.dtype != torch.bool else x.to(torch.float64)
            nz = a[a != 0]
            return TensorStats(shape, dtype, x.numel(), float(a.max()), float(a.pow(2).mean().sqrt()),
                               float(nz.min()) if nz.numel() else math.inf, True, True)
        x = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        a = x.abs()
        # read back together, one wait for the device instead of four (the figures of the finite
        # case; the rest is recomputed below where they do not hold)
        absmax, rms, smallest, whole = torch.stack([
            a.max(), a.pow(2).mean().sqrt(), torch.where(a == 0, torch.full_like(a, math.inf), a).min(),
            (a == a.round()).all().to(a.dtype)]).tolist()
        # absmax: inf or NaN (max propagates NaN) exactly when some value is not finite
        if math.isfinite(absmax) and absmax <= 1e18:
            return TensorStats(shape, dtype, x.numel(), absmax, rms, smallest, True, absmax >= 1 and whole == 1.0)
        finite = math.isfinite(absmax)
        if not finite:
            a = a[torch.isfinite(a)]
            if a.numel() == 0:
                return TensorStats(shape, dtype, x.numel(), math.inf, math.inf, math.inf, False, False)
            absmax = float(a.max())
        # the mean square in float64 so that values near fp32's range do not overflow it
        rms = float(a.double().pow(2).mean().sqrt()) if absmax > 1e18 else float(a.pow(2).mean().sqrt())
        smallest = float(torch.where(a == 0, torch.full_like(a, math.inf), a).min())
        integer_valued = absmax >= 1 and bool((a == a.round()).all())
        return TensorStats(shape, dtype, x.numel(), absmax, rms, smallest, finite, integer_valued)


def _gap_direction(node: Node, value: torch.Tensor) -> Optional[Tuple[torch.Tensor, int, int]]:
    """For an argmax/argmin (or max/min over a dim): +1 at each row's winner and -1 at its runner-up,
    the number of rows, and the dim. A backward pass along it weighs what changes the margin itself: errors
    the two values share (both logits come from the same features) do not flip the decision."""
    dim = node.attrs.get("dim")
    if node.fn not in ("argmax", "argmin", "max", "min") or not isinstance(dim, int) or value.dim() == 0 or not value.numel():
        return None
    if value.shape[dim] < 2:
        return None
    with torch.no_grad():
        x = value.detach()
        top = x.topk(2, dim=dim, largest=node.fn in ("argmax", "max")).indices
        direction = torch.zeros_like(x)
        direction.scatter_(dim, top.narrow(dim, 0, 1), 1.0)
        direction.scatter_(dim, top.narrow(dim, 1, 1), -1.0)
    return direction, x.numel() // x.shape[dim], dim % x.dim()


def _rounding_error(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What rounding ``value`` to ``dtype`` changes, element by element (0 where it overflows, which
    the range checks report)."""
    with torch.no_grad():
        v = value.detach()
        error = v.to(dtype).to(v.dtype) - v
        return torch.where(torch.isfinite(error), error, torch.zeros_like(error))


def _module_weights(module: torch.nn.Module) -> List[torch.Tensor]:
    """The weights a conv, linear or attention module multiplies with (MultiheadAttention keeps them
    in in_proj_weight, or q/k/v_proj_weight, and out_proj)."""
    found = []
    for name in ("weight", "in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor):
            found.append(value)
    out_proj = getattr(module, "out_proj", None)
    if isinstance(out_proj, torch.nn.Linear):
        found.append(out_proj.weight)
    return found


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

    __slots__ = ("tensor", "version", "snapshot")

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor
        self.snapshot: Optional[torch.Tensor] = None
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


class _Sink:
    """Where the hooks of one backward pass add up their squared products (grad * value)."""

    def __init__(self, defer: Optional[bool] = None) -> None:
        # sums on a GPU stay there until resolve() (None: on every device but the CPU), see add
        self.defer = defer
        self.out: Dict[str, float] = {}
        self.operands: Dict[int, float] = {}  # id(_Watched) -> sum
        self.exact: Dict[str, Dict[str, float]] = {}
        self.unknown: set = set()  # values written in place where the observer could not see it
        self.reach: Optional[Dict[str, float]] = None  # see ReferenceObserver._gains
        self.queued: List[Tuple[dict, Any, torch.Tensor]] = []  # (acc, key, sum on the device), see add

    def add(self, acc: dict, key, grad: Optional[torch.Tensor], value: torch.Tensor) -> None:
        if grad is None or grad.shape != value.shape:  # an empty tensor: no gradient, nothing to round
            return
        product = (grad.detach() * value).reshape(-1)
        defer = product.device.type != "cpu" if self.defer is None else self.defer
        if defer and product.is_floating_point():
            # On a GPU the sum stays there until the pass has run (resolve): reading it at once would
            # stop the backward pass at every hook until the device caught up. Taken as the CPU falls
            # back to below.
            self.queued.append((acc, key, _finite_squares(product)))
            return
        total = float(torch.dot(product, product)) if product.is_floating_point() else math.nan
        if not math.isfinite(total):
            total = float(_finite_squares(product))
        acc[key] = acc.get(key, 0.0) + total

    def resolve(self) -> None:
        """Add the sums left on the device into their accumulators (one read for all)."""
        if not self.queued:
            return
        totals = torch.stack([t for _, _, t in self.queued]).tolist()
        for (acc, key, _), total in zip(self.queued, totals):
            acc[key] = acc.get(key, 0.0) + total
        self.queued = []


def _finite_squares(product: torch.Tensor) -> torch.Tensor:
    """The sum of squares of the finite elements, in float64: an intended infinity (a -inf attention
    mask) has gradient 0 and is exact, no error; and a sum beyond float32's range fits float64."""
    product = product.double()
    product = torch.where(torch.isfinite(product), product, torch.zeros_like(product))
    return torch.dot(product, product)


# Operands autograd refuses to differentiate (a batch norm's running statistics, read by F.batch_norm
# in modules FX looks into): the model gets them without gradient. fn -> positions in
# torch.nn.functional's signature, positions in torch's (weight and bias come first there), keywords.
_NO_GRADIENT_OPERANDS = {
    "batch_norm": ((1, 2), (3, 4), ("running_mean", "running_var")),
    "instance_norm": ((1, 2), (3, 4), ("running_mean", "running_var")),
}


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
        self.with_sensitivity = with_sensitivity and any(a.gradients for a in self.analyses)
        self.by_id: Dict[int, Tuple[TensorStats, torch.Tensor]] = {}
        self.values: Dict[str, torch.Tensor] = {}  # node name -> float output kept for the backward passes
        self.watched: Dict[str, _Watched] = {}  # node name -> its value as the node made it
        self.operands: Dict[str, List[_Watched]] = {}  # node name -> operand views / weights it rounds
        self.by_storage: Dict[Any, List[_Watched]] = {}  # what an in-place write may change
        self.view_origin: Dict[int, torch.Tensor] = {}  # id of an operand view -> the tensor it views
        self.producers: Dict[int, str] = {}  # id of a value the run made (kept alive by by_id) -> its node
        self.operand_sources: Dict[int, Optional[str]] = {}  # id of an operand view -> the node that made its value
        self.operand_gains: Dict[int, float] = {}  # id of an operand view -> its gain in the last backward pass
        self.handles: List[Any] = []  # hooks on values made during the run
        self._sink: Optional[_Sink] = None  # set during a backward pass
        self.first_nonfinite: Optional[str] = None
        self.masked: set = set()  # nodes whose infinities are intended (masks), not a failure
        self.constant_leaves: List[torch.Tensor] = []  # float values made from constants, see _as_leaf
        self.constant_names: set = set()  # nodes whose value is a constant, rounded with known errors
        self.exact_rounding: Dict[str, Dict[str, float]] = {}
        self.input_names: List[str] = []
        self.failures: List[str] = []  # "node: error" of statistics that could not be computed
        self.unknown_values: set = set()
        self.poison = PoisonTracker(self.origin)  # integer elements computed from inf or NaN
        self.large: set = set()  # nodes with values beyond float16's range, see _gains' ``reach``
        self.on_node: Callable[[], None] = lambda: None  # called once a node ran (a progress bar)

    def reset(self) -> bool:
        """Forget a run that failed part-way, for another run from the start."""
        for h in self.handles:
            h.remove()
        on_node = self.on_node
        self.__init__(self.analyses, self.with_sensitivity)
        self.on_node = on_node
        return True

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

    def _protect(self, target) -> None:
        """Keep the values of every watched tensor that a write into ``target`` is about to change."""
        if not isinstance(target, torch.Tensor):
            return
        for entry in self.by_storage.get(_storage_key(target), ()):
            if entry.snapshot is None and not entry.changed:
                entry.snapshot = entry.tensor.detach().clone()

    def _on_value_grad(self, name: str, entry: _Watched, grad: Optional[torch.Tensor]) -> None:
        sink = self._sink
        if sink is None or grad is None:  # a backward pass of the model's own, or nothing to weigh
            return
        value = entry.value()
        if value is None:
            sink.unknown.add(name)
            return
        sink.add(sink.out, name, grad, value)
        if sink.reach is not None and name in self.large and grad.shape == value.shape:
            live = value.abs()[(grad.detach() != 0) & torch.isfinite(value)]
            if live.numel():
                sink.reach[name] = max(sink.reach.get(name, 0.0), float(live.max()))
        if name in self.constant_names:
            # Constants (buffers, parameters read as values, tables the forward builds) are rounded
            # once, with errors that are known exactly: weigh those instead of a statistical model of
            # them. A position table's highest frequency is often exactly 1.0, which no format rounds.
            for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
                sink.add(sink.exact.setdefault(name, {}), fmt, grad, _rounding_error(value, dtype))

    def _on_operand_grad(self, entry: _Watched, grad: Optional[torch.Tensor]) -> None:
        sink = self._sink
        if sink is None or grad is None:
            return
        value = entry.value()
        if value is not None:
            sink.add(sink.operands, id(entry), grad, value)

    # ------------------------------------------------------------------ observer protocol

    def before(self, node: Node, args, kwargs, callee):
        if not self.with_sensitivity:
            return args, kwargs
        try:
            return self._before(node, args, kwargs, callee)
        except Exception as exc:  # noqa: BLE001 - the model runs on with its own operands
            self._failed(node, "operand views", exc)
            return args, kwargs

    def _before(self, node: Node, args, kwargs, callee):
        inplace = is_inplace_call(callee, kwargs)
        if inplace and args:
            self._protect(args[0])
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
        dot = node.kind in DOT_PRODUCT_KINDS
        amplifying = node.kind in AMPLIFYING_KINDS
        if not (dot or amplifying):
            return args, kwargs
        views: List[_Watched] = []

        def as_view(v, position=None):
            if isinstance(v, torch.Tensor) and v.is_floating_point() and v.requires_grad:
                if v.is_leaf:  # a weight passed as an argument: hook the parameter itself
                    if dot:  # only a dot product rounds its weights; other ops' inputs are activations
                        views.append(_Watched(v))
                    return v
                if inplace and position == 0:
                    # the op writes into it: a view of it would lose its history to the write (autograd
                    # routes the gradient around the view), so the op gets the tensor itself
                    return v
                view = v.view_as(v)
                entry = self._watch(view)
                views.append(entry)
                self.operand_sources[id(entry)] = self.producers.get(id(v))
                self.handles.append(hook_gradient(view, partial(self._on_operand_grad, entry)))
                # a view of a view has the root as its _base; remember which tensor this one stands for
                self.view_origin[id(view)] = v
                return view
            return v

        args = tuple(as_view(a, i) for i, a in enumerate(args))
        kwargs = {k: as_view(v) for k, v in kwargs.items()}
        if dot and isinstance(callee, torch.nn.Module):
            for weight in _module_weights(callee):
                if weight.requires_grad and weight.is_leaf:
                    views.append(_Watched(weight))
        if views:
            self.operands[node.name] = views
        return args, kwargs

    def __call__(self, node: Node, args, kwargs, callee, output):
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
        if outputs and outputs[0].is_floating_point() and outputs[0].requires_grad:
            value = outputs[0]
            self.values[node.name] = value
            entry = self.watched[node.name] = self._watch(value)
            if not value.is_leaf:  # leaves (inputs, parameters) are hooked per pass, see _gains
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

    def _gains(self, roots: List[torch.Tensor], seed: int, probes: int,
               cotangents: Optional[List[torch.Tensor]] = None, count: Optional[int] = None,
               reach: Optional[Dict[str, float]] = None) -> Dict[str, Tuple[float, float]]:
        """Per node, E over v of (sum_j (g_j y_j)^2, sum over operands of sum_k (g_k a_k)^2) / N_roots.

        With ``cotangents`` (one pass), the gains of those fixed directions, per one of ``count`` units:
        the error of a decision's margins rather than of its input's elements. ``reach`` receives, for
        the nodes in ``self.large``, the largest magnitude among the elements with a nonzero gradient:
        the elements the roots depend on. What a ``where`` or ``masked_fill`` drops, or softmax turns
        into an exact 0 (a finfo.min mask), has gradient 0, so overflowing there reaches nothing."""
        n_out = count or sum(r.numel() for r in roots)
        sink = _Sink()
        sink.reach = reach
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
        leaves = [self.values[n] for n in self.input_names] or list(self.values.values())
        leaves = leaves + list(weights.values()) + self.constant_leaves
        generator = torch.Generator().manual_seed(seed)
        self._sink = sink
        try:
            for _ in range(probes if cotangents is None else 1):
                # drawn on the CPU whatever the device: the same directions, so the same gains, everywhere
                vs = cotangents or [torch.randn(r.shape, generator=generator, dtype=r.dtype).to(r.device) for r in roots]
                backward_for_hooks(roots, leaves, vs)
            sink.resolve()
        finally:
            self._sink = None
            for h in handles:
                h.remove()
        scale = 1.0 / (n_out * (probes if cotangents is None else 1))
        self.exact_rounding = {n: {fmt: v * scale for fmt, v in per.items()} for n, per in sink.exact.items()}
        self.unknown_values = sink.unknown
        self.operand_gains = {key: v * scale for key, v in sink.operands.items()}
        op_acc = {name: sum(sink.operands.get(id(e), 0.0) for e in entries) for name, entries in self.operands.items()
                  if any(id(e) in sink.operands for e in entries)}
        # (in the order the pass met them, not a set's: sums over these gains then add up in the same
        # order in every process, and a report is the same figure for figure on every run)
        names = [n for n in dict.fromkeys([*sink.out, *op_acc]) if n not in sink.unknown]
        return {n: (sink.out.get(n, 0.0) * scale, op_acc.get(n, 0.0) * scale) for n in names}

    def _input_gains(self, node: Node, entries: List[_Watched]) -> Tuple[float, Dict[str, float]]:
        """The gains of rounding the operands of an op that is not a dot product, per output element (an
        operand reused by R outputs: its gain / R), in all and per input node."""
        out_numel = node.out.numel if node.out is not None else 0
        total = 0.0
        by_input: Dict[str, float] = {}
        for entry in entries:
            gain = self.operand_gains.get(id(entry))
            if gain is None:
                continue
            numel = entry.tensor.numel()
            if numel and out_numel > numel:
                gain *= numel / out_numel
            total += gain
            source = self.operand_sources.get(id(entry))
            if source is not None:
                by_input[source] = by_input.get(source, 0.0) + gain
        return total, by_input

    def _gap_gains(self, root: torch.Tensor, direction: torch.Tensor, rows: int, dim: int) -> Dict[str, Tuple[float, float]]:
        """Gains of the decisions' margins: backward passes along the winner-minus-runner-up direction
        with a random sign per row, so that errors shared by different rows (a rounded weight) add up
        as they do row by row, not as one sum over all rows."""
        generator = torch.Generator().manual_seed(2)
        probes = max(1, min(4, math.ceil(64 / rows)))
        total: Dict[str, List[float]] = {}
        for _ in range(probes):
            shape = list(direction.shape)
            shape[dim] = 1
            signs = torch.randint(0, 2, shape, generator=generator).to(direction.device, direction.dtype) * 2 - 1
            for name, (gain_out, gain_operands) in self._gains([root], seed=1, probes=1, cotangents=[direction * signs],
                                                                count=rows).items():
                acc = total.setdefault(name, [0.0, 0.0])
                acc[0] += gain_out / probes
                acc[1] += gain_operands / probes
        return {name: (v[0], v[1]) for name, v in total.items()}

    def finish(self, graph: Graph, output: Any) -> None:
        """The gradient analyses' backward passes (each node's gains to the output, and to the input of
        each risky decision or rounding to integers), then let go of every value kept."""
        try:
            if self.first_nonfinite is not None and not self._nonfinite_reaches(graph, output):
                self.first_nonfinite = None  # inf or NaN at elements the model discards before its output
            self.poison.clear()
            if self.with_sensitivity:
                self._backward_passes(graph, output)
        finally:
            if self.failures:
                shown = "; ".join(self.failures[:2]) + (f" and {len(self.failures) - 2} more" if len(self.failures) > 2 else "")
                graph.notes.append(f"statistics of {len(self.failures)} node(s) could not be recorded ({shown})")
            for h in self.handles:
                h.remove()
            self.handles.clear()
            self.values.clear()
            self.watched.clear()
            self.operands.clear()
            self.by_storage.clear()
            self.view_origin.clear()
            self.by_id.clear()
            self.producers.clear()
            self.operand_sources.clear()
            self.operand_gains.clear()
            self.constant_leaves.clear()

    def _backward_passes(self, graph: Graph, output: Any) -> None:
        passes = BackwardPasses(self, graph, output)
        # (those that read the passes from the outputs first, as they ran before there were analyses:
        # a decision's pass that fails costs the gains nothing)
        gradient = sorted((a for a in self.analyses if a.gradients), key=lambda a: bool(a.needs))
        try:
            for analysis in gradient:
                analysis.finish(graph, passes)
        except Exception as exc:  # noqa: BLE001 - an op without a derivative: predictions fall back to no amplification
            text = str(exc).strip().splitlines()
            graph.notes.append(f"error propagation estimated without gradients ({text[0] if text else type(exc).__name__})")


@dataclass
class MainPass:
    """What the backward passes from the model's outputs found, per node name."""

    gains: Dict[str, Tuple[float, float]]  # (gain of rounding the result, of rounding the operands)
    operands: frozenset  # nodes whose operands were watched (their second gain is meaningful)
    exact: Dict[str, Dict[str, float]]  # constants: format -> the gain of their exact rounding errors
    reach: Dict[str, float]  # values beyond float16's range: the largest magnitude the outputs depend on
    # ops other than dot products: (the gain of rounding their operands per output element, the same per input node)
    inputs: Dict[str, Tuple[float, Dict[str, float]]]


class BackwardPasses:
    """The reference pass's backward passes, run when a gradient analysis first asks for them: the
    pass from the model's outputs (``main``, once) and one from each decision's input (``toward``)."""

    def __init__(self, observer: "ReferenceObserver", graph: Graph, output: Any) -> None:
        self.observer = observer
        self.graph = graph
        self.roots = [v for v in output_tensors(output) if v.is_floating_point() and v.requires_grad and v.numel()]
        self._main: Optional[MainPass] = None

    @property
    def large(self) -> set:
        """Nodes with values beyond float16's range."""
        return self.observer.large

    def main(self) -> Optional[MainPass]:
        """The passes from the model's outputs (None when no float output has a gradient)."""
        if self._main is None and self.roots:
            observer = self.observer
            n_out = sum(r.numel() for r in self.roots)
            probes = max(1, min(4, math.ceil(64 / n_out)))
            reach: Dict[str, float] = {}
            gains = observer._gains(self.roots, seed=0, probes=probes, reach=reach)
            # (per input node, from this pass's operand gains, which the decisions' passes replace)
            inputs = {name: observer._input_gains(self.graph[name], entries) for name, entries in observer.operands.items()
                      if self.graph.get(name) is not None and self.graph[name].kind not in DOT_PRODUCT_KINDS}
            self._main = MainPass(gains, frozenset(observer.operands), observer.exact_rounding, reach, inputs)
            if observer.unknown_values:
                self.graph.notes.append(
                    f"{len(observer.unknown_values)} value(s) were overwritten in place where preclint could not "
                    f"see it (first: {sorted(observer.unknown_values)[0]}); their error propagation is not estimated")
        return self._main

    def root(self, name: str) -> Optional[torch.Tensor]:
        """The value of node ``name`` as a root of a backward pass; None where it has no gradient or the
        model overwrote it since (its gradient would be that of the new values)."""
        observer = self.observer
        if name not in observer.values or observer.watched[name].changed:
            return None
        return observer.values[name]

    def gains_toward(self, root: torch.Tensor) -> Dict[str, Tuple[float, float]]:
        """The gains toward the value ``root`` (from ``root``), per element of it."""
        return self.observer._gains([root], seed=1, probes=max(1, min(2, math.ceil(64 / root.numel()))))

    def toward(self, node: Node) -> Tuple[Dict[str, Tuple[float, float]], Optional[Dict[str, Tuple[float, float]]]]:
        """The gains toward the input of decision ``node`` (its ``root``), and along its winner minus
        runner-up direction where it picks a winner per row."""
        root = self.root(node.inputs[0]) if node.inputs else None
        if root is None:
            raise ValueError(f"{node.name}'s input cannot root a backward pass")
        gains = self.gains_toward(root)
        gap = _gap_direction(node, root)
        return gains, (self.observer._gap_gains(root, *gap) if gap else None)


def backward_for_hooks(roots: List[torch.Tensor], leaves: List[torch.Tensor], cotangents: List[torch.Tensor]) -> None:
    """One backward pass from ``roots`` to ``leaves`` whose gradients only the hooks read.

    ``torch.autograd.grad`` would return every leaf's gradient at once: for a model's weights, as much
    memory as the weights (52 GB for a 13B model in float32). Here each leaf's gradient is dropped as
    soon as it is made (the hooks have seen it by then); the leaves' own ``.grad`` is left as it was."""
    post = getattr(torch.Tensor, "register_post_accumulate_grad_hook", None)
    if post is None:  # torch before 2.1
        torch.autograd.grad(roots, leaves, grad_outputs=cotangents, retain_graph=True, allow_unused=True)
        return
    unique = list({id(t): t for t in leaves}.values())
    saved = {id(t): t.grad for t in unique if t.is_leaf}
    handles = []
    for t in unique:
        if t.is_leaf:
            t.grad = None
            handles.append(t.register_post_accumulate_grad_hook(_drop_grad))
    try:
        torch.autograd.backward(roots, grad_tensors=cotangents, retain_graph=True, inputs=unique)
    finally:
        for h in handles:
            h.remove()
        for t in unique:
            t.grad = saved.get(id(t)) if t.is_leaf else None


def _drop_grad(t: torch.Tensor) -> None:
    t.grad = None


def param_stats(module: torch.nn.Module) -> Dict[str, TensorStats]:
    stats = {}
    for name, p in list(module.named_parameters()) + list(module.named_buffers()):
        stats[name] = tensor_stats(p)
    return stats
