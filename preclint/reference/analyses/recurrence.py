"""Error that accumulates over the steps of a recurrence (nn.LSTM, nn.GRU, nn.RNN): each step rounds
its GEMMs' operands and stores its states in the format, and the recurrence's own Jacobian carries
every step's error into the later states, amplifying or damping it step after step.

A module boundary sees none of it: rounding only the RNN's input and output predicted a trained
3-layer LSTM (Resemblyzer's speaker encoder) 3-16x under the measured error. Here the reference pass
reruns the module step by step in float64 (measure/recurrent.py) and weighs each step's roundings by
their gradients from each of the module's outputs, along PROBES random directions: the gain of a
relative error of every gate pre-activation's terms (operand rounding, C_INPUT u), and of every stored
state (C_OUTPUT u), summed over the steps, which is the per-step amplification by the recurrence's
Jacobian taken over the whole sequence. The error model multiplies them by the mode's u
(predict/error_model.py) and carries the outputs' errors on through the model's gains.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict

from preclint.capture.observer import Call
from preclint.core.ir import Node
from preclint.reference.analyses import ForwardAnalysis

PROBES = 2  # random directions per output of the module


@dataclass
class Recurrence:
    """Per output of the module (its flattened tensors: output, h_n, c_n), the mean-square error per
    element that a unit relative error of the steps' product terms (``operands``) and of their stored
    states (``states``) puts on it, summed over the steps; and the sequence length."""

    steps: int
    operands: Dict[int, float] = field(default_factory=dict)
    states: Dict[int, float] = field(default_factory=dict)

    def relative(self, index: int, rms: float, operand_u: float, state_u: float) -> float:
        """The relative RMS error of output ``index`` (of RMS ``rms``) with the operands rounded at
        ``operand_u`` (C_INPUT u) and the states at ``state_u`` (C_OUTPUT u; 0 where stored exactly)."""
        if rms <= 0 or index not in self.operands:
            return 0.0
        return (operand_u**2 * self.operands[index] + state_u**2 * self.states.get(index, 0.0)) ** 0.5 / rms


class RecurrenceAnalysis(ForwardAnalysis):
    record = Recurrence

    def observe(self, node: Node, call: Call) -> None:
        import torch

        from preclint.measure.recurrent import Steps, run_steps, steppable

        module = call.callee
        if not isinstance(module, torch.nn.Module) or not steppable(module, call.args):
            return

        def double(value):
            return value.detach().double() if isinstance(value, torch.Tensor) else value

        x = double(call.args[0])
        hx = call.args[1] if len(call.args) > 1 else call.kwargs.get("hx")
        hx = tuple(double(h) for h in hx) if isinstance(hx, (tuple, list)) else double(hx)
        weights = {name: p.detach().double().requires_grad_(True) for name, p in module.named_parameters(recurse=False)}
        keep = Steps()
        with torch.enable_grad():
            output = run_steps(module, x, hx, keep=keep, terms=True, weights=weights)
            outputs = [output[0]] + (list(output[1]) if isinstance(output[1], tuple) else [output[1]])
            generator = torch.Generator().manual_seed(0)
            record = Recurrence(steps=x.shape[1] if module.batch_first and x.dim() == 3 else x.shape[0])
            values = keep.pre + keep.states
            for index, value in enumerate(outputs):
                if value is None or not value.requires_grad or not value.numel():
                    continue
                operands = states = 0.0
                for _ in range(PROBES):
                    v = torch.randn(value.shape, generator=generator, dtype=value.dtype)
                    grads = torch.autograd.grad(value, values, v, retain_graph=True, allow_unused=True)
                    for g, terms in zip(grads[:len(keep.pre)], keep.terms):
                        if g is not None:
                            operands += float((g * terms).pow(2).sum())
                    for g, state in zip(grads[len(keep.pre):], keep.states):
                        if g is not None:
                            states += float((g * state.detach()).pow(2).sum())
                units = value.numel() * PROBES
                record.operands[index], record.states[index] = operands / units, states / units
        node.put(record)
