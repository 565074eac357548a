"""preclint.capture.trees walks plain containers itself and must give exactly pytree's leaves, order and
structure, and hand anything else to pytree."""
from collections import OrderedDict, namedtuple

import pytest
import torch
from torch.utils._pytree import tree_flatten, tree_map

from preclint.capture.trees import flatten, leaves, map_tensors


def structure(value):
    """pytree's spec, a torch.Size taken as the tuple pytree rebuilds it as (preclint keeps it a Size)."""
    return tree_flatten(_sizes_as_tuples(value))[1]


def _sizes_as_tuples(value):
    if isinstance(value, torch.Size):
        return tuple(value)
    if type(value) in (tuple, list):
        return type(value)(_sizes_as_tuples(v) for v in value)
    if type(value) is dict:
        return {k: _sizes_as_tuples(v) for k, v in value.items()}
    return value


a, b, c = torch.ones(2), torch.zeros(3), torch.arange(4)
Pair = namedtuple("Pair", "first second")

VALUES = [
    a,
    (a, b),
    [a, 1.5, None],
    ((a, b),),                                    # torch.cat((a, b))
    (a, (Ellipsis, slice(None, 2, None))),        # x[..., :2]
    {"z": a, "y": [b, {"x": c}], "w": 3},         # a dict keeps its insertion order
    (a, torch.Size([2, 3])),                      # x.view(shape): a Size is a pytree node of ints
    torch.Size([4]),                              # x.shape
    torch.float32,                                # x.dtype
    (Pair(a, b), c),                              # a namedtuple inside: pytree's walk
    OrderedDict(q=a, p=b),
    [],
    (None,),
]


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_leaves_are_pytrees_leaves_in_pytrees_order(value):
    expected = tree_flatten(value)[0]
    got = leaves(value)
    assert len(got) == len(expected)
    assert all(x is y for x, y in zip(got, expected))


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_map_tensors_is_tree_map_over_tensors(value):
    double = lambda t: t * 2  # noqa: E731
    expected = tree_map(lambda v: double(v) if isinstance(v, torch.Tensor) else v, value)
    got = map_tensors(double, value)
    assert structure(got) == structure(expected)
    for x, y in zip(tree_flatten(got)[0], tree_flatten(expected)[0]):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
    assert type(_sizes_as_tuples(got)) is type(expected)
    if isinstance(value, torch.Size) or (isinstance(value, tuple) and value and isinstance(value[-1], torch.Size)):
        assert type(got if isinstance(value, torch.Size) else got[-1]) is torch.Size


@pytest.mark.parametrize("args, kwargs", [
    ((a, 2), {}),
    ((a,), {"dim": -1, "out": None}),
    (((a, b),), {"dim": 0}),
    ((a, (Ellipsis, slice(1, None))), {}),
    ((a,), {"size": torch.Size([2])}),
    ((Pair(a, b),), {"w": [c]}),
])
def test_flatten_rebuilds_the_call_with_new_leaves(args, kwargs):
    flat, rebuild = flatten(args, kwargs)
    assert [id(v) for v in flat] == [id(v) for v in tree_flatten((args, kwargs))[0]]
    replaced = [v + 1 if isinstance(v, torch.Tensor) else v for v in flat]
    new_args, new_kwargs = rebuild(replaced)
    assert isinstance(new_args, tuple) and isinstance(new_kwargs, dict)
    expected_args, expected_kwargs = tree_map(lambda v: v + 1 if isinstance(v, torch.Tensor) else v, (args, kwargs))
    assert structure((new_args, new_kwargs)) == structure((tuple(expected_args), expected_kwargs))
    for x, y in zip(tree_flatten((new_args, new_kwargs))[0], tree_flatten((expected_args, expected_kwargs))[0]):
        assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y
