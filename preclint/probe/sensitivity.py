"""The sensitivity pass: the model with autograd; after each mode's sweep, one backward pass with the
mode's measured output error as the cotangent gives J_i^T E at every node i at once, and so each
node's contribution <J_i e_i, E> (ledger.py). Gradients only weight errors, a few digits are plenty,
so on a GPU this pass runs under bfloat16 autocast."""
from __future__ import annotations

import contextlib
from functools import partial
from typing import Any, Dict, List, Optional, Tuple

import torch

from preclint.core.ir import Kind
from preclint.load.modelio import Inputs
from preclint.capture.observer import Observer
from preclint.measure.program import Program
from preclint.measure.execute import tensors
from preclint.reference.statistics_pass import carries_error, hook_gradient
from preclint.capture.trees import flatten


class Sensitivity(Observer):
    """The float32 run with autograd whose backward passes weight each node's local error."""

    def __init__(self) -> None:
        self.roots: List[torch.Tensor] = []
        self.root_index: List[int] = []  # position of each root among the output's float tensors
        self.leaves: List[torch.Tensor] = []
        self.handles: List[Any] = []
        self._errors: Dict[str, List[Optional[torch.Tensor]]] = {}
        self._acc: Dict[str, torch.Tensor] = {}
        # values whose gradient reaches no earlier value (an embedding's output): where the weights
        # must not be leaves, the backward passes stop there
        self.entries: List[torch.Tensor] = []

    def __call__(self, node, args, kwargs, callee, output):
        if node.kind == Kind.OUTPUT:
            return output
        output = carries_error(node, args, output)  # errors flow on through a detach
        entry = None
        for j, t in enumerate(tensors(output)):
            if t.is_floating_point() and t.requires_grad:
                self.handles.append(hook_gradient(t, partial(self._on_grad, node.name, j)))
                if entry is None:
                    entry = not t.is_leaf and all(v.is_leaf for v in flatten(args, kwargs)[0]
                                                  if isinstance(v, torch.Tensor) and v.requires_grad)
                if entry:
                    self.entries.append(t)
        return output

    def _on_grad(self, name: str, index: int, grad: torch.Tensor):
        errors = self._errors.get(name)
        if errors is None or index >= len(errors) or errors[index] is None or grad is None:
            return None
        e = errors[index]
        if e.shape != grad.shape:
            return None
        # one product and one float32 sum per value (errors and gradients need only a few digits)
        term = torch.sum(grad * e, dtype=torch.float32)
        self._acc[name] = self._acc[name] + term if name in self._acc else term
        return None

    def contributions(self, errors: Dict[str, List[Optional[torch.Tensor]]], output_error: List[Optional[torch.Tensor]],
                      norm: torch.Tensor) -> Tuple[List[str], Optional[torch.Tensor]]:
        """(nodes, <J_i e_i, E> / ||E||^2 of each as one vector on the device): ``norm`` is ||E||,
        on the device: reading it back here would stall the GPU; a zero or non-finite norm is
        caught when the figures are read."""
        cotangents = []
        roots = []
        for root, position in zip(self.roots, self.root_index):
            e = output_error[position] if position < len(output_error) else None
            if e is None or e.shape != root.shape:
                continue
            roots.append(root)
            cotangents.append((e / norm).to(root.dtype))
        # a model's code may switch a weight's gradient off as it runs (Pegasus's sinusoidal positions)
        leaves = [leaf for leaf in self.leaves if leaf.requires_grad]
        if not roots or not leaves:
            return [], None
        self._errors, self._acc = errors, {}
        try:
            torch.autograd.grad(roots, leaves, cotangents, retain_graph=True, allow_unused=True)
        finally:
            self._errors = {}
        if not self._acc:
            return [], None
        names = list(self._acc)
        return names, torch.stack([self._acc[name] for name in names]) / norm

    def close(self) -> None:
        for h in self.handles:
            h.remove()
        self.handles = []
        self.roots = []
        self.leaves = []


def sensitivity_pass(program: Program, graph, model32: torch.nn.Module, inputs32,
                     autocast: Optional[torch.dtype] = None) -> Sensitivity:
    """Run the float32 model with autograd, hooks on every value. Parameters get no gradient unless
    nothing else reaches the output (token-id models), so each backward costs about one forward.

    ``autocast``: run it under autocast to that dtype. Gradients only weight errors: a few digits
    do, and on a GPU a bfloat16 backward pass costs half a float32 one (its time is in moving
    activations). benchmarks/README.md measures the contributions against exact one-node runs.

    A model whose gradient must go through its weights (token ids in) has its backward passes stop at
    the values its weights first make (an embedding's output): every value gets the same gradient as
    with the weights as leaves, and no gradient per weight (as large as the model) is made."""
    sens = Sensitivity()
    inputs = Inputs.of(inputs32).map(_with_grad)
    leaves = [v for v in inputs.tensors() if v.requires_grad]
    # parameters the graph reads as values of their own (FX get_attr): their rounding is a node's error
    by_name = dict(model32.named_parameters())
    constants = [by_name[p] for n in graph.nodes if n.kind == Kind.CONSTANT for p in n.params if p in by_name]
    saved = {id(p): p.requires_grad for p in model32.parameters()}
    try:
        for p in model32.parameters():
            p.requires_grad_(False)
        for p in constants:
            p.requires_grad_(True)
        leaves += [p for p in constants]
        with torch.enable_grad(), _autocast(inputs, autocast):
            floats: List[torch.Tensor] = []
            if leaves:  # (with nothing to take a gradient from, as for token ids, this run would be in vain)
                output = program.run(model32, inputs, sens)
                floats = [t for t in tensors(output) if t.is_floating_point()]
            if not any(t.requires_grad for t in floats):
                # no float input reaches the output (token ids): take the gradient through the weights
                sens.close()
                sens = Sensitivity()
                for p in model32.parameters():
                    p.requires_grad_(p.is_floating_point())
                leaves = [p for p in model32.parameters() if p.requires_grad]
                with _autocast(inputs, autocast):
                    output = program.run(model32, inputs, sens)
                floats = [t for t in tensors(output) if t.is_floating_point()]
                leaves = sens.entries or leaves
        sens.roots = [t for t in floats if t.requires_grad]
        sens.root_index = [i for i, t in enumerate(floats) if t.requires_grad]
        sens.leaves = leaves
    finally:
        for p in model32.parameters():
            p.requires_grad_(saved.get(id(p), p.requires_grad))
    return sens


def _autocast(inputs: Inputs, dtype: Optional[torch.dtype]):
    if dtype is None:
        return contextlib.nullcontext()
    device = next((t.device for t in inputs.tensors()), torch.device("cpu"))
    return torch.autocast(device.type, dtype=dtype)


def _with_grad(value: torch.Tensor) -> torch.Tensor:
    return value.detach().clone().requires_grad_(True) if value.is_floating_point() else value
