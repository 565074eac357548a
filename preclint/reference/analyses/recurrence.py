"""Error that accumulates over the steps of a recurrence (nn.LSTM, nn.GRU, nn.RNN): each step rounds
its GEMMs' operands and stores its states in the format, and the recurrence's own Jacobian carries
every step's error into the later states, amplifying or damping it step after step.

A module boundary sees none of it: rounding only the RNN's input and output predicted a trained
3-layer LSTM (Resemblyzer's speaker encoder) 3-16x under the measured error. Here the reference pass
reruns the module step by step in float64 (measure/recurrent.py) and weighs each rounding by its
gradients, from the model's output (the main backward pass's gradients of the RNN's outputs, carried
through the steps) and from each of the module's outputs along PROBES random directions: the gain of
a relative error of each layer's input, of every stored state and of every weight (rounded once, the
same error at every step: coherent over the steps), summed over the steps, which is the per-step amplification by the recurrence's
Jacobian taken over the whole sequence. The error model multiplies them by the mode's u
(predict/error_model.py) and carries the outputs' errors on through the model's gains.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from preclint.capture.observer import Call
from preclint.core.ir import Node
from preclint.reference.analyses import GradientAnalysis, GradientListener, direction_like

PROBES = 2  # random directions per output of the module


@dataclass
class Recurrence:
    """Per output of the module (its flattened tensors: output, h_n, c_n), the mean-square error per
    element that a unit relative error puts on it, summed over the steps: of the first layer's input
    (``inputs``), of the later layers' inputs (``later_inputs``: the states below, which a cast
    format stores already rounded and TF32 rounds as the GEMM reads them), of the stored states
    (``states``) and of the weights (``weights``: rounded once, the same error at every step, so it
    adds up coherently over the steps, as a trained integrator sums a systematic error); and the
    sequence length."""

    steps: int
    inputs: Dict[int, float] = field(default_factory=dict)
    later_inputs: Dict[int, float] = field(default_factory=dict)
    states: Dict[int, float] = field(default_factory=dict)
    weights: Dict[int, float] = field(default_factory=dict)
    # the same four as the model's output feels them: the main backward pass's gradients of the RNN's
    # outputs carried through its steps, per output element of the model (None where the pass did
    # not reach the RNN's outputs)
    to_output: Optional[Tuple[float, float, float, float]] = None

    @staticmethod
    def combined(sums, operand_u: float, state_u: float) -> float:
        """The mean-square error from ``sums`` (first input, later inputs, states, weights) with each
        GEMM operand rounded at ``operand_u`` (C_INPUT u / sqrt 2) and the states stored at ``state_u``
        (C_OUTPUT u, or 0 where they stay float32 and the GEMMs round them as operands instead)."""
        first, later, states, weights = sums
        if state_u:
            return operand_u**2 * (first + weights) + state_u**2 * states
        return operand_u**2 * (first + later + weights + states)

    def relative(self, index: int, rms: float, operand_u: float, state_u: float) -> float:
        """The relative RMS error of output ``index`` (of RMS ``rms``)."""
        if rms <= 0 or index not in self.inputs:
            return 0.0
        sums = (self.inputs[index], self.later_inputs[index], self.states[index], self.weights[index])
        return self.combined(sums, operand_u, state_u) ** 0.5 / rms


class _Unrolled:
    """One RNN call rerun step by step in float64 with autograd: its outputs and the values whose
    rounding is weighed (each layer's input, the states, the weight matrices)."""

    def __init__(self, node: Node, outputs, keep, matrices) -> None:
        self.node, self.outputs, self.keep, self.matrices = node, outputs, keep, matrices
        self.values = keep.inputs + keep.states + matrices
        self.cotangents: List[Dict[int, object]] = []  # per direction of the main pass: output index -> gradient

    def sums(self, cotangents) -> Tuple[float, float, float, float]:
        """(first input, later inputs, states, weights): the squared gradients times the values whose
        rounding is weighed, from the outputs with ``cotangents`` (index -> gradient)."""
        import torch

        roots = [self.outputs[i] for i in cotangents]
        grads = torch.autograd.grad(roots, self.values, list(cotangents.values()), retain_graph=True, allow_unused=True)
        n_inputs, n_states = len(self.keep.inputs), len(self.keep.states)
        weighed = [float((g * v.detach()).pow(2).sum()) if g is not None else 0.0 for g, v in zip(grads, self.values)]
        return (weighed[0], sum(weighed[1:n_inputs]), sum(weighed[n_inputs:n_inputs + n_states]),
                sum(weighed[n_inputs + n_states:]))


class RecurrenceAnalysis(GradientAnalysis, GradientListener):
    record = Recurrence

    def __init__(self) -> None:
        self._unrolled: List[_Unrolled] = []

    def watch(self, node: Node, call: Call) -> list:
        import torch

        module = call.callee
        if not isinstance(module, (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)):
            return []  # (before the import: a check of a model without RNNs loads none of measure/)
        from preclint.measure.recurrent import Steps, run_steps, steppable  # lazy: the plain check loads no probe/measure/plan

        if not steppable(module, call.args):
            return []

        def double(value):
            return value.detach().double() if isinstance(value, torch.Tensor) else value

        x = double(call.args[0]).requires_grad_(True)
        hx = call.args[1] if len(call.args) > 1 else call.kwargs.get("hx")
        hx = tuple(double(h) for h in hx) if isinstance(hx, (tuple, list)) else double(hx)
        weights = {name: p.detach().double().requires_grad_(True) for name, p in module.named_parameters(recurse=False)}
        keep = Steps()
        with torch.enable_grad():
            output = run_steps(module, x, hx, keep=keep, weights=weights)
            outputs = [output[0]] + (list(output[1]) if isinstance(output[1], tuple) else [output[1]])
            unrolled = _Unrolled(node, outputs, keep, [w for name, w in weights.items() if name.startswith("weight")])
            generator = torch.Generator().manual_seed(0)
            record = Recurrence(steps=x.shape[1] if module.batch_first and x.dim() == 3 else x.shape[0])
            for index, value in enumerate(outputs):
                if value is None or not value.requires_grad or not value.numel():
                    continue
                totals = [0.0, 0.0, 0.0, 0.0]
                for _ in range(PROBES):
                    v = direction_like(value, generator)
                    totals = [a + b for a, b in zip(totals, unrolled.sums({index: v}))]
                units = value.numel() * PROBES
                first, later, states, weights = (t / units for t in totals)
                record.inputs[index], record.later_inputs[index] = first, later
                record.states[index], record.weights[index] = states, weights
        node.put(record)
        self._unrolled.append(unrolled)
        return []

    def listen(self, passes):
        return self if self._unrolled else None

    def on_grad(self, name: str, value, grad) -> None:
        """The main pass's gradient of a value that is one of an RNN's outputs (the model takes it with
        a getitem): kept, per direction, to carry through the RNN's steps."""
        if grad is None:
            return
        for unrolled in self._unrolled:
            for index, mine in enumerate(unrolled.outputs):
                if mine is None or tuple(mine.shape) != tuple(value.shape):
                    continue
                reference = mine.detach()
                scale = float(reference.abs().max()) or 1.0
                if float((value.detach().double() - reference).abs().max()) > 1e-5 * scale:
                    continue
                # (a gradient for an output already heard in this direction starts the next direction)
                if not unrolled.cotangents or index in unrolled.cotangents[-1]:
                    unrolled.cotangents.append({})
                unrolled.cotangents[-1][index] = grad.detach().double()
                return

    def finish(self, graph, passes) -> None:
        run = passes.main() if self._unrolled else None
        for unrolled in self._unrolled:
            record = unrolled.node.record(Recurrence)
            if run is None or record is None or not unrolled.cotangents:
                continue
            totals = [0.0, 0.0, 0.0, 0.0]
            for cotangents in unrolled.cotangents:
                totals = [a + b for a, b in zip(totals, unrolled.sums(cotangents))]
            record.to_output = tuple(t / run.units for t in totals)
        self._unrolled.clear()
