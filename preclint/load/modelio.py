"""The values at a model's boundary: the inputs of one call, and the outputs it returns.

Inputs are one call, ``model(*args, **kwargs)``. Either part may nest tensors in lists, tuples and
dicts (a detector takes a list of images; a transformer takes ``attention_mask=``) and hold None,
numbers and strings (``use_cache=False``).

Outputs may nest tensors in tuples, lists, dicts, named tuples, dataclasses and Hugging Face's
``ModelOutput``. :func:`output_leaves` walks all of them; for the types torch's pytree knows it
yields the tensors in pytree's order, so its numbering agrees with code that uses ``tree_flatten``.
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Tuple

import torch

from preclint.core.notes import Note
from torch.utils._pytree import tree_flatten, tree_map

__all__ = ["Inputs", "describe_value", "output_leaves", "output_tensors", "output_notes"]

# Messages list at most this many items of one list or dict; the rest are counted.
_MAX_LISTED = 6


@dataclass(frozen=True)
class Inputs:
    """The example inputs of one call: ``module(*args, **kwargs)``."""

    args: tuple = ()
    kwargs: Dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, value: Any) -> "Inputs":
        """``value`` as Inputs: Inputs as they are; a tuple or list is the positional inputs."""
        if isinstance(value, Inputs):
            return value
        return cls(tuple(value))

    def map(self, fn: Callable[[torch.Tensor], Any]) -> "Inputs":
        """The same call with ``fn`` applied to every tensor, however deeply nested; an object that
        holds tensors (a transformers ``Cache``) is copied with its tensors mapped."""
        if not self.holds_objects():
            args, kwargs = tree_map(lambda v: fn(v) if isinstance(v, torch.Tensor) else v, (list(self.args), self.kwargs))
            return Inputs(tuple(args), dict(kwargs))
        args, kwargs = _map_value((list(self.args), self.kwargs), fn, set())
        return Inputs(tuple(args), dict(kwargs))

    def tensors(self) -> List[torch.Tensor]:
        if not self.holds_objects():
            return [v for v in tree_flatten((list(self.args), self.kwargs))[0] if isinstance(v, torch.Tensor)]
        return [leaf for _, leaf in output_leaves((list(self.args), self.kwargs)) if isinstance(leaf, torch.Tensor)]

    def call(self, module: Callable[..., Any]) -> Any:
        """``module`` called on these inputs; an object among them that the forward may change (a
        KV cache it appends to) is a fresh copy at each call, so that every run sees the same inputs."""
        if self.holds_objects():
            fresh = self.map(lambda t: t)
            return module(*fresh.args, **fresh.kwargs)
        return module(*self.args, **self.kwargs)

    def holds_objects(self) -> bool:
        """Whether an input is an object that holds tensors (a transformers Cache), not a tensor or a
        container pytree knows."""
        return any(_tensor_attributes(leaf, set()) for leaf in tree_flatten((list(self.args), self.kwargs))[0])

    def named(self) -> List[Tuple[str, Any]]:
        """(name, value) of each input that holds a tensor: keywords by their name, a lone positional
        input as ``x``, several as ``input_0``, ``input_1``... (by position, None included)."""
        positional = [("x" if len(self.args) == 1 else f"input_{i}", v) for i, v in enumerate(self.args)]
        return [(name, v) for name, v in positional + list(self.kwargs.items()) if _holds_tensor(v)]

    def bind(self, function: Callable[..., Any], *leading: Any) -> inspect.BoundArguments:
        """This call bound to ``function``'s parameters, defaults applied (``leading``: ``self``).
        Raises TypeError where the call does not fit, as calling it would."""
        bound = inspect.signature(function).bind(*leading, *self.args, **self.kwargs)
        bound.apply_defaults()
        return bound

    def describe(self) -> str:
        """``1x3x224x224 float32`` per input; keywords as ``name=...``; nested values in [] and {}."""
        parts = [describe_value(v) for v in self.args] + [f"{k}={describe_value(v)}" for k, v in self.kwargs.items()]
        return ", ".join(parts) or "no inputs"


def describe_value(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        dims = "x".join(str(d) for d in value.shape) or "scalar"
        return f"{dims} {str(value.dtype).replace('torch.', '')}"
    if isinstance(value, Mapping):
        items = [f"{k}: {describe_value(v)}" for k, v in list(value.items())[:_MAX_LISTED]]
        return "{" + ", ".join(items) + _more(len(value)) + "}"
    if isinstance(value, (list, tuple)):
        items = [describe_value(v) for v in list(value)[:_MAX_LISTED]]
        return "[" + ", ".join(items) + _more(len(value)) + "]"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    return type(value).__name__


def _more(count: int) -> str:
    return f", and {count - _MAX_LISTED} more" if count > _MAX_LISTED else ""


def _holds_tensor(value: Any) -> bool:
    return any(isinstance(v, torch.Tensor) for _, v in output_leaves(value))


# -------------------------------------------------------------------------------------------- outputs


def output_leaves(value: Any, path: str = "") -> Iterator[Tuple[str, Any]]:
    """(path, leaf) for every leaf of a nested output: ``[0]``, ``['logits']``, ``.boxes``.

    Mappings (``ModelOutput`` is one: its unset fields are absent) yield their values, lists and
    tuples their items, dataclasses their fields, types registered with torch's pytree their
    children; anything else (None, a number, a string, a cache object) is a leaf of its own.
    """
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from output_leaves(item, f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        names = getattr(value, "_fields", None)  # a named tuple
        for i, item in enumerate(value):
            yield from output_leaves(item, f"{path}.{names[i]}" if names else f"{path}[{i}]")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from output_leaves(getattr(value, f.name), f"{path}.{f.name}")
    else:
        children = _pytree_children(value)
        attributes = _tensor_attributes(value, set()) if children is None else None
        if children is not None:
            for i, item in enumerate(children):
                yield from output_leaves(item, f"{path}[{i}]")
        elif attributes:  # an object that holds tensors: a transformers Cache, its layers
            for name, item in attributes.items():
                yield from output_leaves(item, f"{path}.{name}")
        else:
            yield path, value


def _pytree_children(value: Any):
    from torch.utils._pytree import SUPPORTED_NODES

    node = SUPPORTED_NODES.get(type(value))
    return None if node is None else list(node.flatten_fn(value)[0])


# Objects are walked this many levels deep at most (a cache's layers' tensors are two levels down).
_MAX_OBJECT_DEPTH = 4
_NOT_CONTAINERS = (type, torch.nn.Module, torch.Tensor, torch.device, torch.dtype, bool, int, float, complex, str, bytes)


def _tensor_attributes(value: Any, seen: set, depth: int = 0) -> Dict[str, Any]:
    """The attributes of a plain object that hold tensors, directly or in lists, dicts and such
    objects (a transformers ``DynamicCache``: its ``layers``, each with ``keys`` and ``values``);
    {} for anything else (a module, a number, a type registered with pytree, an object without tensors)."""
    if value is None or isinstance(value, _NOT_CONTAINERS) or depth > _MAX_OBJECT_DEPTH or id(value) in seen:
        return {}
    if isinstance(value, (Mapping, list, tuple)) or dataclasses.is_dataclass(value) or _pytree_children(value) is not None:
        return {}
    attributes = getattr(value, "__dict__", None)
    if not isinstance(attributes, dict):
        return {}
    seen = seen | {id(value)}
    return {name: item for name, item in attributes.items() if not name.startswith("__") and _holds_tensors(item, seen, depth + 1)}


def _holds_tensors(value: Any, seen: set, depth: int) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, Mapping):
        return any(_holds_tensors(v, seen, depth) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensors(v, seen, depth) for v in value)
    return bool(_tensor_attributes(value, seen, depth))


def _map_value(value: Any, fn: Callable[[torch.Tensor], Any], seen: set) -> Any:
    """``value`` with ``fn`` applied to each tensor: containers pytree knows rebuilt by pytree, an
    object that holds tensors shallow-copied with those attributes mapped, anything else as it is."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    from torch.utils._pytree import SUPPORTED_NODES

    node = SUPPORTED_NODES.get(type(value))
    if node is not None:
        children, context = node.flatten_fn(value)
        return node.unflatten_fn([_map_value(child, fn, seen) for child in children], context)
    attributes = _tensor_attributes(value, seen)
    if not attributes:
        return value
    fresh = copy.copy(value)
    for name, item in attributes.items():
        setattr(fresh, name, _map_value(item, fn, seen | {id(value)}))
    return fresh


def output_tensors(value: Any) -> List[torch.Tensor]:
    """Every tensor of a nested output, in :func:`output_leaves` order."""
    if isinstance(value, torch.Tensor):  # the common case, without the walk
        return [value]
    return [leaf for _, leaf in output_leaves(value) if isinstance(leaf, torch.Tensor)]


def tensor_output_paths(output: Any) -> Tuple[str, ...]:
    """The path of each tensor in a nested output, in order (``output_leaves``)."""
    return tuple(path for path, leaf in output_leaves(output) if isinstance(leaf, torch.Tensor))


def output_notes(output: Any) -> List[Note]:
    """What the report says about outputs that nothing compares: values that are not tensors, and a
    model without a floating-point output tensor (whose rounding no output error can show)."""
    leaves = list(output_leaves(output))
    others = [(path, leaf) for path, leaf in leaves if not isinstance(leaf, torch.Tensor)]
    tensors = [leaf for _, leaf in leaves if isinstance(leaf, torch.Tensor)]
    notes: List[Note] = []
    if not any(t.is_floating_point() or t.is_complex() for t in tensors):
        if tensors:
            returned = f"only {len(tensors)} integer or bool tensor{'s' if len(tensors) > 1 else ''}"
            consequence = "no output error is predicted; --probe counts the values that change"
        else:
            returned = "no tensor" if not others else f"{_kinds(others)} and no tensor"
            consequence = "there is no output error to predict or measure"
        notes.append(Note("load", f"the model returns {returned}: {consequence}"))
    elif others:
        shown = ", ".join(f"output{path} ({_kind(leaf)})" for path, leaf in others[:_MAX_LISTED])
        notes.append(Note("load", f"outputs that are not tensors were not compared: {shown}{_more(len(others))}"))
    return notes


def _kind(leaf: Any) -> str:
    return "None" if leaf is None else type(leaf).__name__


def _kinds(leaves: List[Tuple[str, Any]]) -> str:
    if len(leaves) == 1:
        leaf = leaves[0][1]
        return "None" if leaf is None else f"a {_kind(leaf)}"
    return f"{len(leaves)} values of type " + ", ".join(sorted({_kind(leaf) for _, leaf in leaves}))
