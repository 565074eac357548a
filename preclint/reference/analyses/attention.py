"""Rounding inside nn.MultiheadAttention: the module is one fused call to the graph (torch.fx keeps it
a leaf), but its products round inside it, and the softmax turns a relative error of the queries and
keys into an absolute error of the logits as large as the logits themselves: on unnormalised or
modulated inputs (a DiT's adaLN scales, RMS-10 features) the probe measured its own error at 10-21x
what rounding its boundary gives.

The reference pass reruns the call decomposed in float64 with autograd (in-projections, scaled scores,
softmax, the weighted sum, the out-projection; the same masks) and weighs a unit relative error of
each value that rounds by its gradient from each output, along PROBES random directions: the module's
inputs and weights (GEMM operands), the projections, probabilities and heads' outputs (GEMM operands
too), and the scores (a GEMM's result the softmax reads: rounded where the mode stores results in the
low format, not under TF32). The error model (predict/error_model.py) multiplies them by the mode's
unit roundoff in place of the module's boundary roundings.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, Optional

from preclint.capture.observer import Call
from preclint.core.ir import Node
from preclint.reference.analyses import GradientAnalysis, direction_like

PROBES = 2  # random directions per output of the module
AGREE = 1e-6  # the decomposition must reproduce the module's float64 output to this relative RMS


@dataclass
class AttentionRoundings:
    """Per output of the module (0: the attention output, 1: the weights where returned), the
    mean-square error per element that a unit relative error puts on it: of the GEMM operands
    (``operands``: inputs, weights, projections, probabilities, heads' outputs) and of the scores
    (``scores``)."""

    operands: Dict[int, float] = field(default_factory=dict)
    scores: Dict[int, float] = field(default_factory=dict)

    def relative(self, index: int, rms: float, operand_u: float, result_u: float) -> float:
        """The relative RMS error of output ``index`` (of RMS ``rms``), each GEMM operand rounded at
        ``operand_u`` and the scores stored at ``result_u`` (0 where they stay float32)."""
        if rms <= 0 or index not in self.operands:
            return 0.0
        return math.sqrt(operand_u**2 * self.operands[index] + result_u**2 * self.scores[index]) / rms


def decomposed(module, query, key, value, *, key_padding_mask=None, need_weights=True, attn_mask=None,
               average_attn_weights=True, is_causal=False):
    """``module``'s forward written out (eval mode, no bias_k/bias_v, no zero attention), in the
    operands' dtype: (output, weights or None, {site: tensor}) where the sites are the values that round."""
    import torch

    batched = query.dim() == 3
    if not batched:
        query, key, value = query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.unsqueeze(0)
    elif module.batch_first:
        query, key, value = (t.transpose(0, 1) for t in (query, key, value))
    length, batch, width = query.shape
    heads, head_dim = module.num_heads, module.head_dim
    dtype = query.dtype
    if module._qkv_same_embed_dim:
        w_q, w_k, w_v = module.in_proj_weight.to(dtype).chunk(3)
    else:
        w_q, w_k, w_v = (getattr(module, f"{n}_proj_weight").to(dtype) for n in "qkv")
    b_q, b_k, b_v = (module.in_proj_bias.to(dtype).chunk(3) if module.in_proj_bias is not None else (None,) * 3)
    w_q, w_k, w_v = (w.detach().requires_grad_(True) for w in (w_q, w_k, w_v))
    w_o = module.out_proj.weight.detach().to(dtype).requires_grad_(True)
    b_o = module.out_proj.bias.detach().to(dtype) if module.out_proj.bias is not None else None
    linear = torch.nn.functional.linear
    q = linear(query, w_q, None if b_q is None else b_q.detach())
    k = linear(key, w_k, None if b_k is None else b_k.detach())
    v = linear(value, w_v, None if b_v is None else b_v.detach())

    def heads_first(t):
        return t.reshape(t.shape[0], batch * heads, head_dim).transpose(0, 1)

    qh, kh, vh = heads_first(q), heads_first(k), heads_first(v)
    scores = torch.bmm(qh, kh.transpose(1, 2)) / math.sqrt(head_dim)
    mask = _additive_mask(attn_mask, key_padding_mask, is_causal, scores, batch, heads)
    probabilities = torch.softmax(scores if mask is None else scores + mask, dim=-1)
    heads_out = torch.bmm(probabilities, vh)
    merged = heads_out.transpose(0, 1).reshape(length, batch, width)
    output = linear(merged, w_o, b_o)
    if not batched:
        output = output.squeeze(1)
    elif module.batch_first:
        output = output.transpose(0, 1)
    weights = None
    if need_weights:
        weights = probabilities.view(batch, heads, length, -1)
        weights = weights.mean(dim=1) if average_attn_weights else weights
        if not batched:
            weights = weights.squeeze(0)
    sites = {"inputs": [query, key, value], "weights": [w_q, w_k, w_v, w_o],
             "operands": [qh, kh, vh, probabilities, merged], "scores": [scores]}
    return output, weights, sites


def _additive_mask(attn_mask, key_padding_mask, is_causal, scores, batch, heads):
    import torch

    total = None
    length, source = scores.shape[1], scores.shape[2]
    if attn_mask is None and is_causal:
        attn_mask = torch.ones(length, source, dtype=torch.bool, device=scores.device).triu(1)
    for mask, per_batch in ((attn_mask, False), (key_padding_mask, True)):
        if mask is None:
            continue
        if mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=scores.dtype, device=scores.device).masked_fill(mask, float("-inf"))
        mask = mask.to(scores.dtype)
        if per_batch:  # (batch, source): the same for every head and query
            mask = mask.view(batch, 1, 1, source).expand(batch, heads, 1, source).reshape(batch * heads, 1, source)
        elif mask.dim() == 2:
            mask = mask.unsqueeze(0)
        total = mask if total is None else total + mask
    return total


def analysable(module, args: tuple, kwargs: dict) -> bool:
    """An eval-mode MultiheadAttention called on tensors, without the extras the decomposition leaves out."""
    import torch

    if not isinstance(module, torch.nn.MultiheadAttention) or (module.training and module.dropout > 0):
        return False
    if module.bias_k is not None or module.add_zero_attn or len(args) < 3:
        return False
    return all(isinstance(a, torch.Tensor) and a.is_floating_point() for a in args[:3])


class AttentionAnalysis(GradientAnalysis):
    record = AttentionRoundings

    def watch(self, node: Node, call: Call) -> list:
        import torch

        module = call.callee
        if not isinstance(module, torch.nn.MultiheadAttention):
            return []
        names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask", "average_attn_weights",
                 "is_causal")
        bound = dict(zip(names, call.args))
        bound.update({k: v for k, v in call.kwargs.items() if k in names})
        args = tuple(bound.get(n) for n in names[:3])
        if not analysable(module, args, call.kwargs):
            return []
        try:
            record = _weighed(module, bound)
        except Exception:  # noqa: BLE001 - a call the decomposition cannot follow keeps its boundary roundings
            record = None
        if record is not None:
            node.put(record)
        return []

    def finish(self, graph, passes) -> None:
        """Nothing to add from the model's passes: ``watch`` weighed each call from its own outputs."""


def _weighed(module, bound: dict) -> Optional[AttentionRoundings]:
    import torch

    def double(value):
        return value.detach().double() if isinstance(value, torch.Tensor) and value.is_floating_point() else value

    inputs = {name: double(value) for name, value in bound.items()}
    for name in ("query", "key", "value"):
        inputs[name] = inputs[name].clone().requires_grad_(True)
    with torch.enable_grad():
        output, weights, sites = decomposed(module, **inputs)
        reference = _module_output(module, bound)
        if reference is None or not _agrees(output, reference):
            return None  # a variant the decomposition does not follow: keep the boundary roundings
        record = AttentionRoundings()
        generator = torch.Generator().manual_seed(0)
        groups = {"operands": sites["inputs"] + sites["weights"] + sites["operands"], "scores": sites["scores"]}
        for index, out in enumerate((output, weights)):
            if out is None or not out.requires_grad or not out.numel():
                continue
            totals = {group: 0.0 for group in groups}
            for _ in range(PROBES):
                direction = direction_like(out, generator)
                for group, values in groups.items():
                    grads = torch.autograd.grad(out, values, direction, retain_graph=True, allow_unused=True)
                    totals[group] += sum(float((g * v.detach()).pow(2).sum()) for g, v in zip(grads, values)
                                         if g is not None)
            units = out.numel() * PROBES
            record.operands[index] = totals["operands"] / units
            record.scores[index] = totals["scores"] / units
    return record


def _module_output(module, bound: dict):
    """The module's own output for the call, in float64, with its parameters cast for this call only
    (torch.func.functional_call: the model's module stays as it is)."""
    import torch

    params = {name: p.detach().double() for name, p in module.named_parameters()}
    args = {k: (v.detach().double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
            for k, v in bound.items()}
    with torch.no_grad():
        try:
            return torch.func.functional_call(module, params, (), args)[0]
        except Exception:  # noqa: BLE001 - a call the decomposition cannot check is left to the boundary
            return None


def _agrees(mine, reference) -> bool:
    import torch

    mine = mine.detach()
    if mine.shape != reference.shape or not bool(torch.isfinite(reference).all()):
        return False
    scale = float(reference.pow(2).mean().sqrt()) or 1.0
    return float((mine - reference).pow(2).mean().sqrt()) <= AGREE * scale
