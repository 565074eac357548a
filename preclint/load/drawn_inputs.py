"""Drawing the inputs ``--input`` and ``--input-shape`` describe: seeded tensors of their shapes, dtypes
and values, integer ids drawn below the rows of the table (an embedding, mostly) that they index."""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from preclint.core.errors import UserError
from preclint.core.notes import Note
from preclint.load.input_specs import InputSpec
from preclint.load.modelio import Inputs


def drawn_inputs(module: nn.Module, specs: Sequence[InputSpec], seed: int, notes: List[Note]) -> Inputs:
    """Random inputs of the given shapes, dtypes and values.

    Floats are drawn from [0, 1), as torchvision's own model tests do. Integer inputs given no
    values are token ids or masks: each is drawn below the rows of the table (an embedding, mostly)
    that first looks it up, found in one run of the model on zeros (token_type_ids then stay below 2
    where input_ids reach the vocabulary), and from {0, 1} when it indexes no table: a valid mask
    (1 attends) and a valid index into anything.
    """
    open_ints = [i for i, spec in enumerate(specs) if _is_index(spec) and spec.fill is None and spec.low is None]
    rows: Dict[int, Tuple[int, str]] = {}
    if open_ints:
        rows = _embedding_rows(module, _draw(specs, seed, None), specs, open_ints)
        described = []
        for i in open_ints:
            if i in rows:
                count, weight = rows[i]
                described.append(f"{_spec_label(specs, i)} below {count}, the rows of {weight} that it indexes")
            else:
                described.append(f"{_spec_label(specs, i)} from {{0, 1}} (it indexes no table)")
        notes.append(Note("load", "integer inputs drawn at random: " + "; ".join(described)
                          + "; --input NAME=SHAPE:DTYPE:VALUES sets them"))
    return _draw(specs, seed, {i: count for i, (count, _) in rows.items()})


def _is_index(spec: InputSpec) -> bool:
    return not (spec.dtype.is_floating_point or spec.dtype.is_complex or spec.dtype == torch.bool)


def _spec_label(specs: Sequence[InputSpec], index: int) -> str:
    if specs[index].name is not None:
        return specs[index].name
    positional = [i for i, spec in enumerate(specs) if spec.name is None]
    return "the input" if len(positional) == 1 else f"input {positional.index(index)}"


def _draw(specs: Sequence[InputSpec], seed: int, index_bounds: Optional[Dict[int, int]]) -> Inputs:
    """The inputs, seeded; open integer inputs are zeros when ``index_bounds`` is None, else drawn
    below their bound (2 where none is known)."""
    try:
        return _draw_tensors(specs, seed, index_bounds)
    except (RuntimeError, MemoryError) as exc:  # more than the memory free now, though less than installed
        if isinstance(exc, RuntimeError) and "allocate" not in str(exc):
            raise
        shown = " and ".join("x".join(map(str, spec.shape)) for spec in specs)
        raise UserError(f"cannot allocate inputs of shape {shown}: not enough free memory; use smaller inputs") from None


def _draw_tensors(specs: Sequence[InputSpec], seed: int, index_bounds: Optional[Dict[int, int]]) -> Inputs:
    torch.manual_seed(seed)
    args, kwargs = [], {}
    for i, spec in enumerate(specs):
        if spec.fill is not None:
            tensor = torch.full(spec.shape, spec.fill, dtype=spec.dtype)
        elif spec.low is not None:
            if spec.dtype.is_floating_point or spec.dtype.is_complex:
                tensor = torch.rand(spec.shape, dtype=spec.dtype) * (spec.high - spec.low) + spec.low
            else:
                tensor = torch.randint(int(spec.low), int(spec.high), spec.shape, dtype=spec.dtype)
        elif spec.dtype.is_floating_point or spec.dtype.is_complex:
            tensor = torch.rand(spec.shape, dtype=spec.dtype)
        elif index_bounds is None and _is_index(spec):
            tensor = torch.zeros(spec.shape, dtype=spec.dtype)
        else:
            bound = 2 if index_bounds is None else index_bounds.get(i, 2)
            tensor = torch.randint(0, bound, spec.shape, dtype=spec.dtype)
        if spec.name is None:
            args.append(tensor)
        else:
            kwargs[spec.name] = tensor
    return Inputs(tuple(args), kwargs)


def _embedding_rows(module: nn.Module, call: Inputs, specs: Sequence[InputSpec],
                    open_ints: Sequence[int]) -> Dict[int, Tuple[int, str]]:
    """spec index -> (rows, table name) of the first lookup that reads the input (or a view of it:
    models reshape ids first): an embedding, ``table[ids]`` or ``index_select``. One run, whose
    failure only means nothing is found: the check's own run reports it."""
    positional = iter(call.args)
    tensors = [call.kwargs[spec.name] if spec.name is not None else next(positional) for spec in specs]
    storages = {tensors[i].untyped_storage().data_ptr(): i for i in open_ints}
    names = {id(t): name for name, t in list(module.named_parameters()) + list(module.named_buffers())}
    found: Dict[int, Tuple[int, str]] = {}

    class _Lookups(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            lookup = _lookup(func, args, kwargs)
            if lookup is not None:
                ids, table, dim = lookup
                index = storages.get(ids.untyped_storage().data_ptr())
                if index is not None and index not in found:
                    found[index] = (int(table.shape[dim]), names.get(id(table), "the tensor"))
            return func(*args, **kwargs)

    try:
        with torch.no_grad(), _Lookups():
            call.call(module)
    except Exception:
        pass
    return found


_EMBEDDINGS = (torch.nn.functional.embedding, torch.nn.functional.embedding_bag)
_INDEX_SELECTS = (torch.index_select, torch.Tensor.index_select)


def _lookup(func: Callable, args: tuple, kwargs: dict) -> Optional[Tuple[torch.Tensor, torch.Tensor, int]]:
    """(ids, table, dim) when ``func`` looks integer ids up along ``dim`` of ``table``."""
    if func in _EMBEDDINGS:
        ids, table, dim = args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("weight"), 0
    elif func is torch.Tensor.__getitem__ and len(args) == 2:
        table, index, dim = args[0], args[1], 0
        ids = index[0] if isinstance(index, tuple) and index else index
    elif func in _INDEX_SELECTS and len(args) == 3:
        table, dim, ids = args
    else:
        return None
    if not (isinstance(ids, torch.Tensor) and isinstance(table, torch.Tensor) and isinstance(dim, int)
            and table.dim() > dim and not ids.dtype.is_floating_point and ids.dtype != torch.bool):
        return None
    return ids, table, dim
