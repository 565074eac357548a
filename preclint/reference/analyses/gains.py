"""Gains: how much a unit relative rounding error at each node reaches the model's output (the error
model of preclint.predict.error_model weighs every node's rounding by them).

One backward pass with a random output cotangent v ~ N(0, I) gives them for every node at once. A
relative rounding error delta (RMS r, independent per element) of a value z moves v.output by
sum_j g_j z_j delta_j, where g = J^T v is z's gradient; its expected square over v and delta is
r^2 sum_j (g_j z_j)^2. So one pass gives, for every node, the gain of rounding its result
(``Gains.out``) and of rounding its operands (``Gains.operands``: the activation a conv or matmul
reads, and its weight). Weights are rounded once for all output positions, so their error is coherent
across the output; weighting by the weight gradient accounts for that where a per-element model would
not.

Other ops that compute values get views of their float operands too (``Gains.inputs``, and per input
node ``Gains.by_input``): the ratio inputs / out is how much the op amplifies a relative error that
arrives at its inputs, the relative condition number of the op weighted by what reaches the output.
An operand spread over many outputs (an SE gate broadcast over the image, a bias table gathered into
an attention map, coordinates sampling a correlation volume) sums the gradients of all the outputs
it reaches; where those agree in sign (a pooling after it), its gain grows with their number R
though no output element's relative error does. The ratio is per output element: such an operand's
gain is divided by R, the outputs per operand element.

The same sums from another root (``gains_toward``) weigh the roundings on their way to a decision's
input (analyses/decision_gains.py) or an amplifier's (analyses/received_gains.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import DOT_PRODUCT_KINDS, Kind, Node
from preclint.reference.analyses import GradientAnalysis, GradientListener

if TYPE_CHECKING:
    import torch

# Ops whose operands get views so that their amplification of incoming error can be read off the
# gradients (shape ops move values and amplify nothing; decisions and comparisons are judged by margins).
AMPLIFYING_KINDS = frozenset({Kind.ELEMENTWISE, Kind.ACTIVATION, Kind.SOFTMAX, Kind.NORM, Kind.REDUCTION,
                              Kind.SCAN, Kind.POOL, Kind.RESAMPLE, Kind.BATCHNORM})


@dataclass
class Gains:
    """How much the error a node adds reaches the output, from the reference pass's backward passes:
    each is ||J^T v||^2 / N_out for a unit relative error of what is rounded."""

    out: float  # rounding the node's result
    operands: Optional[float] = None  # rounding the operands of a dot product
    inputs: Optional[float] = None  # rounding the inputs of another op: sqrt(inputs / out) is how it amplifies
    # the same per input node (what ``inputs`` adds up): each input's error weighed by its own gain.
    # An input spread over many outputs (a broadcast, a gathered table) counts per output element, so
    # its gain is divided by the outputs each of its elements reaches (see the module's docstring)
    by_input: Dict[str, float] = field(default_factory=dict)
    rounding: Dict[str, float] = field(default_factory=dict)  # format -> the exact rounding of the result, where measured

    @property
    def amplification(self) -> Optional[float]:
        """sqrt(inputs / out): how many times the op multiplies a relative error arriving at its inputs;
        None where the gradients do not tell."""
        if self.inputs is None or not self.out or self.out <= 0 or not math.isfinite(self.inputs / self.out):
            return None
        return math.sqrt(self.inputs / self.out)


def module_weights(module) -> List[torch.Tensor]:
    """The weights a conv, linear or attention module multiplies with (MultiheadAttention keeps them
    in in_proj_weight, or q/k/v_proj_weight, and out_proj)."""
    import torch

    found = []
    for name in ("weight", "in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight"):
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor):
            found.append(value)
    out_proj = getattr(module, "out_proj", None)
    if isinstance(out_proj, torch.nn.Linear):
        found.append(out_proj.weight)
    return found


def rounded_operands(node: Node, call: Call) -> List[torch.Tensor]:
    """What the gains weigh of ``node`` besides its result: the operands of a dot product (the activation
    it reads and its weights, a module's included), and the activations another op that computes values
    reads (only a dot product rounds its weights; other ops' inputs are activations)."""
    import torch

    dot = node.kind in DOT_PRODUCT_KINDS
    if not (dot or node.kind in AMPLIFYING_KINDS):
        return []
    found = [v for v in (*call.args, *call.kwargs.values()) if isinstance(v, torch.Tensor) and (dot or not v.is_leaf)]
    if dot and isinstance(call.callee, torch.nn.Module):
        found += module_weights(call.callee)
    return found


def rounding_error(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """What rounding ``value`` to ``dtype`` changes, element by element (0 where it overflows, which
    the range checks report)."""
    import torch

    with torch.no_grad():
        v = value.detach()
        error = v.to(dtype).to(v.dtype) - v
        return torch.where(torch.isfinite(error), error, torch.zeros_like(error))


def finite_squares(product: torch.Tensor) -> torch.Tensor:
    """The sum of squares of the finite elements, in float64: an intended infinity (a -inf attention
    mask) has gradient 0 and is exact, no error; and a sum beyond float32's range fits float64."""
    import torch

    # (nan_to_num zeroes inf and NaN as where(isfinite(p), p, 0) does, in one pass instead of three)
    product = torch.nan_to_num(product.double(), nan=0.0, posinf=0.0, neginf=0.0)
    return torch.dot(product, product)


class GainSums(GradientListener):
    """Hears a backward pass and adds up its squared products (grad * value): per node for its value,
    per operand for each watched operand, and for the nodes in ``constants`` (values rounded once, with
    errors known exactly) those of their exact rounding errors in float16 and bfloat16."""

    def __init__(self, constants: frozenset = frozenset(), defer: Optional[bool] = None) -> None:
        self.constants = constants
        # sums on a GPU stay there until resolve() (None: on every device but the CPU), see add
        self.defer = defer
        self.out: Dict[str, float] = {}
        self.operands: Dict[int, float] = {}  # id(operand) -> sum
        self.exact: Dict[str, Dict[str, float]] = {}
        self.queued: List[Tuple[dict, Any, torch.Tensor]] = []  # (acc, key, sum on the device), see add
        self._last: Optional[_Product] = None  # the last sum added, see add

    def on_grad(self, name: str, value, grad) -> None:
        self.add(self.out, name, grad, value)
        if name in self.constants:
            import torch

            # Constants (buffers, parameters read as values, tables the forward builds) are rounded
            # once, with errors that are known exactly: weigh those instead of a statistical model of
            # them. A position table's highest frequency is often exactly 1.0, which no format rounds.
            for fmt, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16)):
                self.add(self.exact.setdefault(name, {}), fmt, grad, rounding_error(value, dtype))

    def on_operand_grad(self, operand, value, grad) -> None:
        self.add(self.operands, id(operand), grad, value)

    def add(self, acc: dict, key, grad: Optional[torch.Tensor], value: torch.Tensor) -> None:
        if grad is None or grad.shape != value.shape:  # an empty tensor: no gradient, nothing to round
            return
        last = self._last
        if last is not None and last.holds(grad, value):
            # the same gradient of the same values as the sum just added: an operand view's and then
            # the value's own, where the value has no other reader (the view's gradient passes to it
            # unchanged), the same figure without another product
            total = last.total
        else:
            product = (grad.detach() * value).reshape(-1)
            defer = product.device.type != "cpu" if self.defer is None else self.defer
            if defer and product.is_floating_point():
                # On a GPU the sum stays there until the pass has run (resolve): reading it at once would
                # stop the backward pass at every hook until the device caught up. Taken as the CPU falls
                # back to below.
                total = finite_squares(product)
            else:
                total = float(product.dot(product)) if product.is_floating_point() else math.nan
                if not math.isfinite(total):
                    total = float(finite_squares(product))
            self._last = _Product(grad, value, total)
        if isinstance(total, float):
            acc[key] = acc.get(key, 0.0) + total
        else:
            self.queued.append((acc, key, total))

    def resolve(self) -> None:
        """Add the sums left on the device into their accumulators (one read for all)."""
        self._last = None  # (the pass has run: its last gradient is let go)
        if not self.queued:
            return
        import torch

        totals = torch.stack([t for _, _, t in self.queued]).tolist()
        for (acc, key, _), total in zip(self.queued, totals):
            acc[key] = acc.get(key, 0.0) + total
        self.queued = []

    def per_operand(self, operands: Dict[str, list]) -> Dict[int, float]:
        """The sums per watched operand (id of its entry among ``operands``' lists), a leaf that several
        calls read sharing one sum among them.

        A leaf (a module's weight, called at every step of a loop) is hooked as it is, once per call that
        reads it, and each hook hears the leaf's whole gradient: the sum of every call's. Rounded, it is
        one rounding (the same cast at every call), whose error reaches the output through that sum: its
        gain is one ||G w||^2, not one per call. Each of the k calls gets 1/k of it; counted per call, a
        cell's weights in a 12-step loop were charged 12 times their gain."""
        self.resolve()
        readers: Dict[int, int] = {}
        for entries in operands.values():
            for e in entries:
                if e.tensor.is_leaf:
                    readers[id(e.tensor)] = readers.get(id(e.tensor), 0) + 1
        return {id(e): self.operands[id(e)] / (readers[id(e.tensor)] if e.tensor.is_leaf else 1)
                for entries in operands.values() for e in entries if id(e) in self.operands}

    def gains(self, operands: Dict[str, list], units: int, unknown: frozenset) -> Dict[str, Tuple[float, float]]:
        """Per node, (sum_j (g_j y_j)^2, sum over its ``operands`` of sum_k (g_k a_k)^2) / ``units``; none
        for the values in ``unknown``, overwritten where the reference pass could not see it."""
        scale = 1.0 / units
        per_operand = self.per_operand(operands)
        per_node = {name: sum(per_operand.get(id(e), 0.0) for e in entries) for name, entries in operands.items()
                    if any(id(e) in per_operand for e in entries)}
        # (in the order the pass met them, not a set's: sums over these gains then add up in the same
        # order in every process, and a report is the same figure for figure on every run)
        names = [n for n in dict.fromkeys([*self.out, *per_node]) if n not in unknown]
        return {n: (self.out.get(n, 0.0) * scale, per_node.get(n, 0.0) * scale) for n in names}


class _Product:
    """A sum GainSums added, with the gradient and the values it came from, held so that their memory
    cannot be reused by other tensors while it is kept: the same memory, layout and versions are the
    same figures."""

    __slots__ = ("grad", "value", "versions", "total")

    def __init__(self, grad: torch.Tensor, value: torch.Tensor, total) -> None:
        self.grad, self.value, self.total = grad, value, total
        self.versions = _versions(grad, value)

    def holds(self, grad: torch.Tensor, value: torch.Tensor) -> bool:
        return (self.versions is not None and _same_memory(grad, self.grad) and _same_memory(value, self.value)
                and _versions(self.grad, self.value) == self.versions)


def _versions(*tensors: torch.Tensor) -> Optional[Tuple[int, ...]]:
    """The tensors' version counters (which in-place writes advance); None where one has none (a
    tensor made in inference mode)."""
    try:
        return tuple(t._version for t in tensors)
    except RuntimeError:
        return None


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two tensors are views of the same elements, laid out alike."""
    return (a.data_ptr() == b.data_ptr() != 0 and a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
            and a.stride() == b.stride())


def gains_toward(passes, root: torch.Tensor) -> Dict[str, Tuple[float, float]]:
    """The gains toward the value ``root`` (from ``root``), per element of it: along random directions,
    as many as make 64 of its elements, at most 2."""
    sums = GainSums()
    run = passes.run([root], [sums], seed=1, probes=max(1, min(2, math.ceil(64 / root.numel()))))
    return sums.gains(passes.operands, run.units, run.unknown)


def input_gains(node: Node, operands: list, gains: Dict[int, float], passes,
                spread: bool = True) -> Tuple[float, Dict[str, float]]:
    """The gains of rounding the ``operands`` of an op, in all and per input node (an operand no node
    made, a weight, counts in all only). ``spread``: per output element, as for an op that is not a dot
    product (an operand reused by R outputs: its gain / R); a dot product sums each activation element
    into many outputs, as its gradient already does, so it passes ``spread=False``."""
    out_numel = node.out.numel if node.out is not None else 0
    total = 0.0
    by_input: Dict[str, float] = {}
    for operand in operands:
        gain = gains.get(id(operand))
        if gain is None:
            continue
        numel = operand.tensor.numel()
        if spread and numel and out_numel > numel:
            gain *= numel / out_numel
        total += gain
        source = passes.source(operand)
        if source is not None:
            by_input[source] = by_input.get(source, 0.0) + gain
    return total, by_input


class GainsAnalysis(GradientAnalysis):
    record = Gains

    def watch(self, node: Node, call: Call) -> List[torch.Tensor]:
        return rounded_operands(node, call)

    def listen(self, passes) -> GainSums:
        self.sums = GainSums(passes.constants)
        return self.sums

    def finish(self, graph, passes) -> None:
        run = passes.main()
        if run is None:
            return
        sums = self.sums
        gains = sums.gains(passes.operands, run.units, run.unknown)
        scale = 1.0 / run.units
        exact = {n: {fmt: v * scale for fmt, v in per.items()} for n, per in sums.exact.items()}
        per_operand = {key: v * scale for key, v in sums.per_operand(passes.operands).items()}
        inputs = {name: input_gains(graph[name], entries, per_operand, passes) for name, entries in passes.operands.items()
                  if graph.get(name) is not None and graph[name].kind not in DOT_PRODUCT_KINDS}
        for name, (gain_out, gain_operands) in gains.items():
            node = graph.get(name)
            if node is None:  # operands of a call that made no node (it returned no tensor)
                continue
            record = Gains(gain_out, rounding=exact.get(name, {}))
            if name in passes.operands:
                if node.kind in DOT_PRODUCT_KINDS:
                    record.operands = gain_operands
                    # (how a relative error arriving in its activations reaches the output: a trained
                    # head that cancels its terms amplifies it, one that averages damps it)
                    record.by_input = input_gains(node, passes.operands[name], per_operand, passes, spread=False)[1]
                elif name in inputs:
                    record.inputs, record.by_input = inputs[name]
            node.put(record)
