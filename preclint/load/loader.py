"""Turn what the user named on the command line into a model and example inputs.

A target is a Python file (``model.py``, ``model.py:Net``) or an importable module
(``package.module`` or ``package.module:attr``). From it we pick one ``nn.Module``, build example
inputs for it, optionally load a state dict with ``weights_only=True``, and hand back a
:class:`LoadedModel` in eval mode. Every mistake a user can make ends in one
:class:`~preclint.core.errors.UserError` line; nothing here prints.

This module is the entry point and the order of the steps; each step is a module beside it:
``target`` (importing), ``build`` (the model), ``input_specs`` and ``drawn_inputs`` (``--input``),
``example_inputs`` (the inputs the code provides) and ``weights``.
"""

from __future__ import annotations

import inspect
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence

from torch import nn

from preclint.load.checkpoints import meta_tensors
from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.build import build_named_model, find_model, require_initialised
from preclint.load.downloads import downloads_refused
from preclint.load.drawn_inputs import drawn_inputs
from preclint.load.example_inputs import check_call_fits, checked_call, inputs_from_code
from preclint.load.input_specs import (InputSpec, check_inputs_fit_in_memory, check_unique_names, parse_dtype,
                                      parse_input, validate_shape)
from preclint.load.messages import check_is_file, first_few
from preclint.load.model_classes import as_float32, from_torchscript, quantized_notes, unwrap_compiled
from preclint.load.modelio import Inputs
from preclint.load.target import import_target
from preclint.load.training import TrainingStep, training_step_from_code
from preclint.load.weights import load_weights

__all__ = ["LoadedModel", "load_model", "loaded_from_module"]


@dataclass
class LoadedModel:
    module: nn.Module  # in eval() mode
    args: tuple  # positional example inputs: tensors, None, numbers, and lists/tuples/dicts of them
    name: str  # display name: "path/model.py:Net" or "torchvision.models:resnet50"
    source_path: Optional[str]  # absolute path of the file the model was defined/loaded from
    kwargs: dict = field(default_factory=dict)  # keyword example inputs, in the same forms
    notes: List[Note] = field(default_factory=list)  # for the report: how the model and its inputs were loaded
    training: Optional[TrainingStep] = None  # --train: the loss, targets, optimizer and scaler of one step
    # the reduced format the model is stored in ("bf16", "fp16"), checked as a float32 copy; "" for float32
    stored: str = ""

    @property
    def inputs(self) -> Inputs:
        """The example call: ``module(*args, **kwargs)``."""
        return Inputs(tuple(self.args), dict(self.kwargs))


def load_model(
    target: str,
    *,
    model: Optional[str] = None,
    input_shapes: Optional[Sequence[Sequence[int]]] = None,
    input_dtype: str = "float32",
    weights: Optional[str] = None,
    seed: int = 0,
    inputs: Optional[Sequence[str]] = None,
    train: bool = False,
) -> LoadedModel:
    """Load the model named by ``target`` (and ``model``), with example inputs and optional weights.

    ``inputs``: ``--input`` specifications (see :func:`~preclint.load.input_specs.parse_input`);
    ``input_shapes``: positional inputs of ``input_dtype``. Either replaces the example inputs the
    code provides. ``train``: the file also gives a training step (load/training.py).
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

        module, class_notes = unwrap_compiled(module, origin.label)
        require_initialised(origin.label, module)
        module.eval()
        if meta_tensors(module):
            # weights built on the meta device are the weights file's to give, before any run
            if weights is None:
                raise UserError(f"{origin.label}: {first_few(meta_tensors(module))} are on the meta device (no values); "
                                "give the weights with --weights FILE (safetensors or a torch.save state dict)")
            load_weights(module, weights)
            weights = None
        notes: List[Note] = list(class_notes)
        if specs is not None:
            call = drawn_inputs(module, specs, seed, notes)
        else:
            call = inputs_from_code(origin, module, seed)
        notes.extend(check_call_fits(module, call, origin.label))
        training = training_step_from_code(origin.namespace, origin.label, origin.file_path, seed,
                                           module) if train else None

    if weights is not None:
        load_weights(module, weights)
    module, script_notes = from_torchscript(module, call, origin.label)
    notes.extend(script_notes)
    module, call, stored, dtype_notes = as_float32(module, call, origin.label, in_place=True)
    notes.extend(dtype_notes + quantized_notes(module, origin.label))

    return LoadedModel(
        module=module,
        args=call.args,
        kwargs=call.kwargs,
        name=f"{origin.label}:{display_attr}",
        source_path=origin.file_path or _defining_file(module),
        notes=notes,
        training=training,
        stored=stored,
    )


def _defining_file(module: nn.Module) -> Optional[str]:
    """The file that defines the model's class, for module targets (torchvision/models/resnet.py)."""
    try:
        found = inspect.getsourcefile(type(module))
    except (TypeError, OSError):
        return None
    return os.path.abspath(found) if found else None


def loaded_from_module(module: nn.Module, inputs) -> LoadedModel:
    """A model the caller built, as the loader would have given it: its inputs as one call, the file
    that defines its class (where findings point)."""
    if not isinstance(module, nn.Module):
        raise UserError(f"expected a path or a torch.nn.Module, not a {type(module).__name__}")
    if inputs is None:
        raise UserError(f"{type(module).__name__}: give the inputs it is called with")
    if isinstance(inputs, Inputs):
        call = inputs
    elif isinstance(inputs, (tuple, list)):
        call = Inputs(tuple(inputs))
    elif isinstance(inputs, dict):
        call = Inputs((), dict(inputs))
    else:
        call = Inputs((inputs,))
    name = type(module).__name__
    call = checked_call(call, f"{name}'s inputs")
    module, notes = unwrap_compiled(module, name)
    module, script_notes = from_torchscript(module, call, name)
    module, call, stored, dtype_notes = as_float32(module, call, name, in_place=False)
    return LoadedModel(module, call.args, name, _defining_file(module),
                       kwargs=call.kwargs, notes=notes + script_notes + dtype_notes + quantized_notes(module, name),
                       stored=stored)
