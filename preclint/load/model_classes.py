"""Models that are not plain eager float32 modules, made checkable as they are.

A ``torch.compile``d module is checked through the module it wraps (``_orig_mod``), outside Dynamo,
so that Dynamo neither compiles preclint's own hooks nor recompiles for them. A TorchScript module
(``torch.jit.script``, ``torch.jit.trace``, a ``torch.jit.load``ed file) has no Python forward and
takes no hooks: it is checked through its graph, converted to an FX graph of aten ops by torch's
TorchScript converter (the ops and weights it runs, under the names its submodules have). Each
step returns the module to check and the notes that say what was checked instead of what was given.
"""
from __future__ import annotations

import copy
import warnings
from typing import List, Tuple

import torch
from torch import nn

from preclint.core.numerics import MODES
from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.modelio import Inputs

__all__ = ["unwrap_compiled", "from_torchscript", "is_torchscript", "as_float32", "modes_as_stored", "stored_low_format", "quantized_notes"]


def unwrap_compiled(module: nn.Module, label: str) -> Tuple[nn.Module, List[Note]]:
    """The module a ``torch.compile``d one wraps (nested wrappers too), and the note that says so."""
    wrapped = module
    while hasattr(wrapped, "_orig_mod") and isinstance(getattr(wrapped, "_orig_mod"), nn.Module) \
            and type(wrapped).__name__ == "OptimizedModule":
        wrapped = wrapped._orig_mod
    if wrapped is module:
        return module, []
    return wrapped, [Note("load", f"{label} is a torch.compile'd module: checked the module it compiles "
                                  f"({type(wrapped).__name__}) eagerly, outside Dynamo; compiled kernels can fuse and "
                                  "reorder what eager runs (`--backend inductor` measures them)")]


def is_quantized_module(module) -> bool:
    """A torch.ao quantized module (``quantize_dynamic``'s Linear, a static int8 Conv2d): it computes
    in int8 whatever precision the float ops run in."""
    return ".quantized." in type(module).__module__ and type(module).__module__.startswith(("torch.ao.nn", "torch.nn"))


def is_torchscript(module) -> bool:
    return isinstance(module, torch.jit.ScriptModule)


def from_torchscript(module: nn.Module, call: Inputs, label: str) -> Tuple[nn.Module, List[Note]]:
    """An FX GraphModule that runs what the TorchScript ``module`` runs on ``call``, and the note
    that says so; a UserError naming what to pass instead where its graph does not convert."""
    if not is_torchscript(module):
        return module, []
    kind = "traced" if isinstance(module, torch.jit.TopLevelTracedModule) else "scripted"
    try:
        from torch._export.converter import TS2EPConverter

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            exported = TS2EPConverter(module, tuple(call.args), dict(call.kwargs) or None).convert().module()
        graph_module = _plain_graph_module(exported)
    except Exception as exc:  # noqa: BLE001 - the converter's failures are many; each says why in one line
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{label} is a TorchScript module ({kind}), which takes no hooks, and torch's TorchScript "
                        f"converter could not turn its graph into one preclint reads ({type(exc).__name__}: "
                        f"{reason[:200]}); check the eager nn.Module it was made from instead (its class, with "
                        "the state dict through --weights)") from exc
    return graph_module, [Note("load", f"{label} is a TorchScript module ({kind}): checked its graph, converted to "
                                       "aten ops by torch's TorchScript converter (findings name those ops and the "
                                       "submodules whose weights they read); the probe runs the converted graph")]


def _plain_graph_module(exported: nn.Module) -> torch.fx.GraphModule:
    """The exported module as a plain GraphModule (an exported one refuses ``eval()``), without
    the guard that checks its inputs' shapes against the example's (the probe's copies are other
    tensors of those shapes, on other devices)."""
    graph = exported.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and str(node.target) == "_guards_fn":
            graph.erase_node(node)
    plain = torch.fx.GraphModule(exported, graph)
    if hasattr(plain, "_guards_fn"):
        delattr(plain, "_guards_fn")
    plain.recompile()
    return plain



# The reduced dtypes a model may be stored in, by the mode that casts a model to each.
_LOW_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16"}


def stored_low_format(module: nn.Module) -> Tuple[str, int, int]:
    """(the reduced format every floating parameter and buffer of ``module`` is stored in, or "" where
    they are not all of one; how many of them are reduced; how many there are)."""
    dtypes = [t.dtype for t in [*module.parameters(), *module.buffers()] if t.is_floating_point()]
    low = [d for d in dtypes if d in _LOW_DTYPES]
    if dtypes and len(low) == len(dtypes) and len(set(low)) == 1:
        return _LOW_DTYPES[low[0]], len(low), len(dtypes)
    return "", len(low), len(dtypes)


def as_float32(module: nn.Module, call: Inputs, label: str, in_place: bool) -> Tuple[nn.Module, Inputs, str, List[Note]]:
    """A model stored in bfloat16 or float16 as a float32 copy (its values exactly), and its inputs
    of that dtype in float32, so that the mode that casts it back (bf16-full) is how it runs; the
    format it is stored in ("" for a float32 model, returned as it is) and the notes."""
    stored, low, total = stored_low_format(module)
    if not stored:
        notes: List[Note] = []
        if low:
            notes.append(Note("load", f"{label}: {low} of its {total} floating parameters and buffers are stored in a "
                                      "reduced dtype and the rest in float32; the predicted figures treat every one as "
                                      "float32 (the model as if stored in float32), while the probe measures it as it is"))
        return module, call, "", notes
    low_dtype = next(d for d, fmt in _LOW_DTYPES.items() if fmt == stored)
    if not in_place:
        module = copy.deepcopy(module)
    module.float()
    call = call.map(lambda t: t.float() if t.dtype == low_dtype else t)
    return module, call, stored, []


def modes_as_stored(modes, stored: str, label: str) -> Tuple[Tuple[str, ...], List[Note]]:
    """The modes that make sense for a model stored in ``stored`` (bf16 or fp16), from those asked
    for: the mode that casts it to its own dtype is how it runs, and stands for TF32 and autocast to
    that dtype (neither changes a model that runs in it); autocast to the other reduced dtype is not
    predicted (the cast of the whole model to it is); the rest as asked. And the note that says so."""
    if not stored:
        return tuple(modes), []
    own = f"{stored}-full"
    other = "fp16" if stored == "bf16" else "bf16"
    name = {"bf16": "bfloat16", "fp16": "float16"}[stored]
    kept: List[str] = []
    replaced, dropped = [], []
    for mode in modes:
        if MODES[mode].rounds_products_only or mode in (stored, own):
            if mode != own:
                replaced.append(mode)
            mode = own
        elif mode == other:
            dropped.append(mode)
            continue
        if mode not in kept:
            kept.append(mode)
    if not kept:
        kept.append(own)
    note = (f"{label} is stored in {name}: it runs in {name} as it is, so {own} (its values cast to {name}, which "
            f"they already are) is how it runs, against float64; the figures are its own, not a change from float32")
    if replaced:
        note += f"; {' and '.join(replaced)} change nothing of a model that runs in {name} and are {own} here"
    if dropped:
        note += (f"; {other} autocast of a {name} model (its matmuls in {other}, the rest in {name}) is not predicted "
                 f"({other}-full predicts casting the whole model)")
    if "fp32" in kept:
        note += "; fp32 is the model cast up to float32"
    return tuple(kept), [Note("load", note)]


def quantized_notes(module: nn.Module, label: str) -> List[Note]:
    """What of a quantized model (torch.ao: ``quantize_dynamic``, static int8 modules) runs in int8
    and what in float, and the int8 layers' own weight rounding (from each layer's scale), which no
    precision mode changes and the predicted figures leave out."""
    layers = [(path, m) for path, m in module.named_modules() if is_quantized_module(m) and callable(getattr(m, "weight", None))]
    if not layers:
        return []
    floats = [f"{path or 'the root'} ({type(m).__name__})" for path, m in module.named_modules()
              if not is_quantized_module(m) and any(p.is_floating_point() for p in m.parameters(recurse=False))]
    rounding = []
    for path, layer in layers:
        error = _weight_rounding(layer.weight())
        rounding.append(f"{path}: {error:.2g}" if error is not None else path)
    shown = ", ".join(rounding[:6]) + (f", and {len(rounding) - 6} more" if len(rounding) > 6 else "")
    kinds = sorted({f"{'dynamic ' if 'dynamic' in type(m).__module__ else ''}{type(m).__name__}" for _, m in layers})
    float_part = (f"{len(floats)} layer{'s' if len(floats) != 1 else ''} with float weights ({', '.join(floats[:6])}"
                  f"{', ...' if len(floats) > 6 else ''})" if floats else "no layer with float weights")
    return [Note("load", f"{label} is quantized: {len(layers)} layer{'s' if len(layers) != 1 else ''} run in int8 "
                         f"({', '.join(kinds)}), and {float_part} and the ops between run in float. The precision "
                         "modes change only the float part, which is what the figures predict; the int8 layers' own "
                         "error is not in them: their weights' rounding, relative to each weight's RMS (a step of the "
                         f"layer's scale, scale/sqrt(12)): {shown}; the 8-bit quantization of their inputs at each "
                         "call adds more (not modelled). Compare with the float model for the quantization error itself")]


def _weight_rounding(weight) -> "float | None":
    """The RMS of an int8 weight's rounding (uniform in a step of its scale) over the RMS of its values."""
    if not getattr(weight, "is_quantized", False):
        return None
    values = weight.dequantize()
    rms = float(values.pow(2).mean().sqrt())
    if weight.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric):
        step = float(weight.q_scale())
    else:
        step = float(weight.q_per_channel_scales().double().pow(2).mean().sqrt())
    return step / 12 ** 0.5 / rms if rms > 0 else None
