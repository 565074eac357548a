"""nn.LSTM, nn.GRU and nn.RNN computed step by step, as their kernels do, with a hook on what each step
stores: the emulation rounds it to the mode's format, the error model's analysis keeps it.

A reduced-precision RNN kernel stores its states in the format between steps and reads them back as
the next step's GEMM operand: oneDNN's bfloat16 LSTM on the CPU (what ``torch.autocast("cpu",
torch.bfloat16)`` runs, through ``mkldnn_rnn_layer``) stores h and c in bfloat16 after every step,
and the rounding compounds over the sequence (a trained 3-layer LSTM: 2.1e-3 native, 2.3e-3 with
both states rounded per step here, 8.3e-4 with the module rounded only at its boundary). cuDNN's
float16 RNN reads h_{t-1} as a float16 GEMM operand the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Tuple

import torch

RECURRENT_TYPES = (torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN)


@dataclass
class Steps:
    """What a stepped run kept, where asked (``keep``): each layer's input (the operand its input GEMM
    reads) and, per layer, direction and step, the stored states (h, and c for an LSTM)."""

    inputs: List[torch.Tensor] = field(default_factory=list)
    states: List[torch.Tensor] = field(default_factory=list)


def steppable(module: torch.nn.Module, args: tuple) -> bool:
    """Whether ``module`` is an RNN this file steps: a plain LSTM, GRU or RNN (no projection) called on a
    tensor (not a PackedSequence)."""
    if type(module) not in RECURRENT_TYPES or not args or not isinstance(args[0], torch.Tensor):
        return False
    return not getattr(module, "proj_size", 0) and args[0].dim() in (2, 3)


def run_steps(module: torch.nn.Module, x: torch.Tensor, hx=None, store: Callable = lambda t: t,
              keep: Optional[Steps] = None, weights: Optional[dict] = None):
    """``module``'s output for input ``x`` (and initial state ``hx``) computed step by step in x's dtype,
    each stored state passed through ``store``; returns what the module returns. ``weights``: tensors
    to use instead of the module's own, by name; ``keep``: where to keep the values whose rounding counts."""
    def weight(name):
        return weights[name] if weights is not None and name in weights else getattr(module, name, None)

    lstm = isinstance(module, torch.nn.LSTM)
    unbatched = x.dim() == 2
    if unbatched:
        x = x.unsqueeze(1) if not module.batch_first else x.unsqueeze(0)
        if hx is not None:
            hx = tuple(h.unsqueeze(1) for h in hx) if lstm else hx.unsqueeze(1)
    if module.batch_first:
        x = x.transpose(0, 1)
    steps, batch = x.shape[0], x.shape[1]
    directions = 2 if module.bidirectional else 1
    hidden = module.hidden_size
    if hx is None:
        zeros = x.new_zeros(module.num_layers * directions, batch, hidden)
        hx = (zeros, zeros) if lstm else zeros
    h0, c0 = (hx[0], hx[1]) if lstm else (hx, None)
    layer_input = x
    last_h, last_c = [], []
    for layer in range(module.num_layers):
        if keep is not None:
            keep.inputs.append(layer_input)
        outputs = []
        for direction in range(directions):
            suffix = f"_l{layer}" + ("_reverse" if direction else "")
            w_ih, w_hh = weight("weight_ih" + suffix), weight("weight_hh" + suffix)
            b_ih = weight("bias_ih" + suffix) if module.bias else None
            b_hh = weight("bias_hh" + suffix) if module.bias else None
            w_ih, w_hh = w_ih.to(x.dtype), w_hh.to(x.dtype)
            b_ih = b_ih.to(x.dtype) if b_ih is not None else None
            b_hh = b_hh.to(x.dtype) if b_hh is not None else None
            index = layer * directions + direction
            h = h0[index].to(x.dtype)
            c = c0[index].to(x.dtype) if lstm else None
            from_input = torch.nn.functional.linear(layer_input, w_ih, b_ih)
            order = range(steps - 1, -1, -1) if direction else range(steps)
            out = [None] * steps
            for t in order:
                gi = from_input[t]
                gh = torch.nn.functional.linear(h, w_hh, b_hh)
                h, c = _cell(module, gi, gh, h, c)
                h = store(h)
                c = store(c) if c is not None else None
                if keep is not None:
                    keep.states += [h] + ([c] if c is not None else [])
                out[t] = h
            outputs.append(torch.stack(out))
            last_h.append(h)
            if lstm:
                last_c.append(c)
        layer_input = torch.cat(outputs, dim=-1) if directions == 2 else outputs[0]
    output = layer_input.transpose(0, 1) if module.batch_first else layer_input
    h_n = torch.stack(last_h)
    c_n = torch.stack(last_c) if lstm else None
    if unbatched:
        output = output.squeeze(0 if module.batch_first else 1)
        h_n = h_n.squeeze(1)
        c_n = c_n.squeeze(1) if c_n is not None else None
    return (output, (h_n, c_n)) if lstm else (output, h_n)


def _cell(module, gi: torch.Tensor, gh: torch.Tensor, h: torch.Tensor,
          c: Optional[torch.Tensor]) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """One step of the cell from the input's and the state's products."""
    if isinstance(module, torch.nn.LSTM):
        i, f, g, o = (gi + gh).chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c), c
    if isinstance(module, torch.nn.GRU):
        ir, iz, in_ = gi.chunk(3, dim=-1)
        hr, hz, hn = gh.chunk(3, dim=-1)
        r, z = torch.sigmoid(ir + hr), torch.sigmoid(iz + hz)
        n = torch.tanh(in_ + r * hn)
        return (1 - z) * n + z * h, None
    pre = gi + gh
    return (torch.tanh(pre) if module.nonlinearity == "tanh" else torch.relu(pre)), None


def stored_in(dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``store`` that rounds each state to ``dtype`` and keeps it in its own dtype."""
    return lambda t: t.to(dtype).to(t.dtype)
