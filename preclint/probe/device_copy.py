"""The model where the probe runs it: one float32 copy on the probe's device, shared by the check's
reference pass (the statistics the rules and predictions read) and by the probe itself.

Without it a GPU probe first ran the whole reference pass on the CPU (minutes, and the activations
and gradients of a large model in host memory). With it, the model's weights are copied to the
device once; the host holds the user's model and nothing more. A model whose float32 copy leaves no
room on the device (with its gradients for the reference pass) keeps its reference pass on the CPU
and the probe streams every copy through the device (stream.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from preclint.load.modelio import Inputs
from preclint.measure.copies import copy_to, to_device
from preclint.probe.stream import model_bytes

# The reference pass keeps, beside the weights, the activations of the run and their gradients:
# the float32 copy may take at most this share of the device's free memory.
WHOLE_COPY_SHARE = 0.5


@dataclass
class Placement:
    device: torch.device
    model: torch.nn.Module  # float32, every tensor on ``device``
    inputs: Inputs  # on ``device``


def place(module: torch.nn.Module, inputs, device: torch.device, force: bool = False) -> Optional[Placement]:
    """The float32 copy of ``module`` on ``device``; None (reference pass on the CPU, as the model is)
    for a CPU device unless ``force`` (tests run this path on the CPU), or where it does not fit."""

    if device.type == "cpu" and not force:
        return None
    if device.type == "cuda" and not force:
        free, _ = torch.cuda.mem_get_info(device)
        if model_bytes(module) > WHOLE_COPY_SHARE * free:
            return None
    with torch.no_grad():
        model = copy_to(module, device)
    _release_staging(device)
    moved = Inputs.of(inputs).map(lambda v: to_device(v, device) if v.device != device else v.detach().clone())
    return Placement(device, model, moved)


def _release_staging(device: torch.device) -> None:
    """Give back the page-locked host memory the copy was staged through (host memory is the
    scarce kind with a large model)."""
    if device.type != "cuda":
        return
    torch.cuda.synchronize(device)
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()
