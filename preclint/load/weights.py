"""Loading ``--weights FILE`` into the model: a state dict found in the checkpoint, DataParallel's
prefix dropped, every mismatch named in one line; the reading itself is checkpoints.py's."""

from __future__ import annotations

import re
from typing import Any, List, Optional

import torch
from torch import nn

from preclint.core.errors import UserError
from preclint.load.checkpoints import CheckpointError, assign_state_dict, meta_tensors, read_checkpoint
from preclint.load.messages import first_few, path_label, quote


def load_weights(module: nn.Module, path: str) -> None:
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
    expected = module.state_dict()
    lossy = lossy_casts(state_dict, expected)
    if lossy:
        raise UserError(f"{label}: {first_few(lossy)}: the model's dtype cannot hold the checkpoint's values; "
                        "save the checkpoint in the model's dtypes (or build the model in the checkpoint's)")
    # complex values whose imaginary parts are all zero: their real parts, which is what they hold
    state_dict = {k: v.real if isinstance(v, torch.Tensor) and v.is_complex() and isinstance(expected.get(k), torch.Tensor)
                  and not expected[k].is_complex() else v for k, v in state_dict.items()}

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


def lossy_casts(state_dict: dict, expected: dict) -> List[str]:
    """What loading ``state_dict`` into tensors of ``expected``'s dtypes would lose, one phrase per
    tensor: the imaginary part of a complex value cast to a real dtype, a fraction (or inf/NaN) cast
    to an integer, a value outside the target's range (an integer's, or a float's finite range: it
    would become inf). Rounding to a float format's precision (a float64 checkpoint in a float32
    model) is what such a load means, not a loss."""
    found = []
    for key, value in state_dict.items():
        target = expected.get(key)
        if not (isinstance(value, torch.Tensor) and isinstance(target, torch.Tensor)) or value.dtype == target.dtype \
                or value.shape != target.shape or value.is_meta:
            continue
        why = _cast_loss(value, target.dtype)
        if why:
            found.append(f"{key} ({str(value.dtype).replace('torch.', '')} to "
                         f"{str(target.dtype).replace('torch.', '')}: {why})")
    return found


def _cast_loss(value: torch.Tensor, dtype: torch.dtype) -> Optional[str]:
    """Why casting ``value`` to ``dtype`` changes it beyond rounding, or None."""
    with torch.no_grad():
        if value.is_complex():
            if dtype.is_complex:
                return None if bool(torch.isfinite(value.to(dtype)).eq(torch.isfinite(value)).all()) else "out of range"
            if bool((value.imag != 0).any()):
                return "its imaginary part would be dropped"
            value = value.real
        if dtype.is_complex:
            return None
        if dtype.is_floating_point:
            if not value.is_floating_point():  # integers: exact up to the format's integer range
                wide = value.to(torch.float64)
                return None if bool((value.to(dtype).to(torch.float64) == wide).all()) else "integers it cannot hold exactly"
            finite = torch.isfinite(value)
            return None if bool((torch.isfinite(value.to(dtype)) == finite).all()) else "values beyond its range"
        if value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                return "inf or NaN"
            if not bool((value == value.trunc()).all()):
                return "fractions"
        info = torch.iinfo(dtype) if dtype != torch.bool else None
        if info is not None:
            wide = value.to(torch.float64) if value.is_floating_point() else value.to(torch.int64)
            if bool(((wide < info.min) | (wide > info.max)).any()):
                return "values beyond its range"
        elif bool(((value != 0) & (value != 1)).any()):
            return "values other than 0 and 1"
    return None


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
