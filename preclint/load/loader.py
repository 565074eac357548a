"""Turn what the user named on the command line into a model and example inputs.

A target is a Python file (``model.py``, ``model.py:Net``) or an importable module
(``package.module`` or ``package.module:attr``). From it we pick one ``nn.Module``, build example
inputs for it, optionally load a state dict with ``weights_only=True``, and hand back a
:class:`LoadedModel` in eval mode. Every mistake a user can make ends in one
:class:`~preclint.core.errors.UserError` line; nothing here prints.
"""

from __future__ import annotations

import inspect
import os
import re
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence

import torch
from torch import nn

from preclint.load.checkpoints import CheckpointError, assign_state_dict, meta_tensors, read_checkpoint
from preclint.core.errors import UserError
from preclint.load.build import build_named_model, find_model, require_initialised
from preclint.load.downloads import downloads_refused
from preclint.load.drawn_inputs import drawn_inputs
from preclint.load.example_inputs import check_call_fits, inputs_from_code
from preclint.load.input_specs import (InputSpec, check_inputs_fit_in_memory, check_unique_names, parse_dtype,
                                      parse_input, validate_shape)
from preclint.load.messages import check_is_file, first_few, path_label, quote
from preclint.load.modelio import Inputs
from preclint.load.target import import_target

__all__ = ["LoadedModel", "load_model"]


@dataclass
class LoadedModel:
    module: nn.Module  # in eval() mode
    args: tuple  # positional example inputs: tensors, None, numbers, and lists/tuples/dicts of them
    name: str  # display name: "path/model.py:Net" or "torchvision.models:resnet50"
    source_path: Optional[str]  # absolute path of the file the model was defined/loaded from
    kwargs: dict = field(default_factory=dict)  # keyword example inputs, in the same forms
    notes: list = field(default_factory=list)  # for the report: how generated inputs were drawn

    @property
    def inputs(self) -> Inputs:
        """The example call: ``module(*args, **kwargs)``."""
        return Inputs(tuple(self.args), dict(self.kwargs))


def load_model(
    target: str,
    model: Optional[str] = None,
    input_shapes: Optional[Sequence[Sequence[int]]] = None,
    input_dtype: str = "float32",
    weights: Optional[str] = None,
    seed: int = 0,
    inputs: Optional[Sequence[str]] = None,
) -> LoadedModel:
    """Load the model named by ``target`` (and ``model``), with example inputs and optional weights.

    ``inputs``: ``--input`` specifications (see :func:`~preclint.load.input_specs.parse_input`); ``input_shapes``: positional
    inputs of ``input_dtype``. Either replaces the example inputs the code provides.
    """
    # Validate the cheap arguments first, so a typo in a flag fails before any user code runs.
    dtype = parse_dtype(input_dtype)
    if inputs and input_shapes:
        raise UserError("give the inputs with --input or with --input-shape, not both")
    specs: Optional[List[InputSpec]] = None
    if inputs:
        specs = [parse_input(text, dtype) for text in inputs]
        check_unique_names(specs)
    elif input_shapes is not None:
        specs = [InputSpec(None, validate_shape(shape), dtype) for shape in input_shapes]
        check_inputs_fit_in_memory(specs)
    if weights is not None:
        check_is_file(weights, what="weights file")

    with downloads_refused():  # user code runs in here: importing, building, example_inputs()
        origin, attr_in_target = import_target(target, seed)
        if attr_in_target is not None and model is not None and attr_in_target != model:
            raise UserError(
                f"{target}: the model is named both in the target ({attr_in_target!r}) "
                f"and with --model ({model!r}); give only one"
            )
        model_name = attr_in_target if attr_in_target is not None else model

        if model_name is not None:
            module = build_named_model(origin, model_name, seed)
            display_attr = model_name
        else:
            display_attr, module = find_model(origin, seed)

        require_initialised(origin.label, module)
        module.eval()
        if meta_tensors(module):
            # weights built on the meta device are the weights file's to give, before any run
            if weights is None:
                raise UserError(f"{origin.label}: {first_few(meta_tensors(module))} are on the meta device (no values); "
                                "give the weights with --weights FILE (safetensors or a torch.save state dict)")
            _load_weights(module, weights)
            weights = None
        notes: List[str] = []
        if specs is not None:
            call = drawn_inputs(module, specs, seed, notes)
        else:
            call = inputs_from_code(origin, module, seed)
        notes.extend(check_call_fits(module, call, origin.label))

    if weights is not None:
        _load_weights(module, weights)

    return LoadedModel(
        module=module,
        args=call.args,
        kwargs=call.kwargs,
        name=f"{origin.label}:{display_attr}",
        source_path=origin.file_path or _defining_file(module),
        notes=notes,
    )


# --------------------------------------------------------------------------------------------
# Weights


def _load_weights(module: nn.Module, path: str) -> None:
    """Load the weights file at ``path`` (safetensors, or a torch.save state dict) into ``module``,
    memory-mapped; a module built on the meta device takes the file's tensors (checkpoints.py)."""
    label = path_label(path)
    try:
        checkpoint = read_checkpoint(path)
    except CheckpointError as exc:
        raise UserError(f"{label}: {exc}") from None
    except Exception as exc:
        raise UserError(
            f"{label}: cannot be loaded with weights_only=True ({_weights_load_reason(exc)}); "
            "save a plain state dict with torch.save(model.state_dict(), path)"
        ) from None

    state_dict = _state_dict_in(checkpoint)
    if state_dict is None:
        raise UserError(
            f"{label}: holds a {type(checkpoint).__name__}, not a state dict "
            "(or a dict with a 'state_dict' or 'model' entry holding one)"
        )
    state_dict = _strip_data_parallel_prefix(state_dict, module)

    try:
        if meta_tensors(module):
            assign_state_dict(module, state_dict)
        else:
            module.load_state_dict(state_dict, strict=True)
    except Exception as exc:
        # The module is partly loaded now; raising means it never reaches the caller.
        raise UserError(f"{label}: weights do not match the model: {_mismatch(module, state_dict, exc)}") from None
    left = meta_tensors(module)
    if left:
        raise UserError(f"{label}: {first_few(left)} stay on the meta device: the weights file does not hold them "
                        "(buffers a model computes, not saves); build those on the CPU and only the weights on meta")


def _state_dict_in(checkpoint: Any) -> Optional[dict]:
    if not isinstance(checkpoint, dict):
        return None
    for key in ("state_dict", "model"):  # Lightning and many training scripts nest it
        nested = checkpoint.get(key)
        if isinstance(nested, dict):
            return nested
    if all(isinstance(key, str) for key in checkpoint):
        return checkpoint
    return None


def _strip_data_parallel_prefix(state_dict: dict, module: nn.Module) -> dict:
    """Checkpoints saved from DataParallel/DDP prefix every key with 'module.'; drop it."""
    prefix = "module."
    if all(key.startswith(prefix) for key in state_dict) and not any(
        key.startswith(prefix) for key in module.state_dict()
    ):
        return {key[len(prefix):]: value for key, value in state_dict.items()}
    return state_dict


def _mismatch(module: nn.Module, state_dict: dict, exc: Exception) -> str:
    """One line naming the first few missing, unexpected and misshapen keys."""
    expected = module.state_dict()
    missing = [key for key in expected if key not in state_dict]
    unexpected = [key for key in state_dict if key not in expected]
    misshapen = [
        f"{key} {tuple(state_dict[key].shape)} vs {tuple(expected[key].shape)} in the model"
        for key in expected
        if key in state_dict
        and isinstance(state_dict[key], torch.Tensor)
        and isinstance(expected[key], torch.Tensor)
        and state_dict[key].shape != expected[key].shape
    ]
    parts = [
        f"{title} {first_few(items)}"
        for title, items in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", misshapen))
        if items
    ]
    return "; ".join(parts) if parts else quote(exc)


def _weights_load_reason(exc: Exception) -> str:
    """The reason in torch's weights_only message, whole: its first sentence after the boilerplate
    (the change of default in 2.6, "Please file an issue", "Check the documentation")."""
    kept = []
    for paragraph in re.split(r"\n\s*\n", str(exc)):
        paragraph = " ".join(paragraph.split())
        if "WeightsUnpickler error:" in paragraph:
            paragraph = paragraph.split("WeightsUnpickler error:", 1)[1].strip()
        elif paragraph.startswith(("Weights only load failed", "Check the documentation")):
            continue
        if paragraph:
            kept.append(paragraph)
    if not kept:
        return quote(exc)
    sentence = re.match(r"(.+?\.)(?:\s|$)", kept[0])
    return sentence.group(1) if sentence else kept[0]


# --------------------------------------------------------------------------------------------
# Small helpers for messages and locations


def _defining_file(module: nn.Module) -> Optional[str]:
    """The file that defines the model's class, for module targets (torchvision/models/resnet.py)."""
    try:
        found = inspect.getsourcefile(type(module))
    except (TypeError, OSError):
        return None
    return os.path.abspath(found) if found else None


