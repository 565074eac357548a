"""The reference pass lets go of what only its forward read before the backward passes run
(statistics_pass ``_forward_done``): a value the model made that no backward pass reads (an index, a
float computed without gradient) is freed by then, while the values the gains read are still held."""
import gc
import weakref

import torch
from torch import nn

from preclint.engine import CheckOptions, build_graph
from preclint.load.loader import LoadedModel
from preclint.reference import statistics_pass
from preclint.reference.analyses.gains import Gains


class _Model(nn.Module):
    """A conv whose output also yields an index (argmax) and a float made without gradient: values
    only the forward's statistics hold once the model has read them."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Conv2d(8, 4, 3)

    def forward(self, x):
        z = self.conv(x)
        index = z.argmax(dim=1, keepdim=True)  # an integer value: no gradient, nothing for the passes
        with torch.no_grad():
            scale = z.abs().mean(dim=(2, 3), keepdim=True) + 1.0  # made without gradient
        picked = torch.gather(z, 1, index)
        return self.head(torch.relu(z) / scale) + picked.mean()


def _alive_at_backward(monkeypatch):
    """Run the reference pass; per value the model made, whether it was still held when the first
    backward pass began (and which values the passes read)."""
    made: dict = {}  # node name -> weak reference to its output
    alive: dict = {}
    record, backward = statistics_pass.ReferenceObserver._record, statistics_pass.ReferenceObserver.backward

    def recording(self, node, args, kwargs, callee, output):
        record(self, node, args, kwargs, callee, output)
        if isinstance(output, torch.Tensor) and node.fn in ("argmax", "add", "abs", "mean"):
            made.setdefault(node.name, (node.fn, weakref.ref(output)))

    def first_backward(self, *args, **kwargs):
        if not alive:
            gc.collect()
            alive.update({name: (fn, ref() is not None) for name, (fn, ref) in made.items()})
            alive["read by the passes"] = ("", sorted(self.values))
        return backward(self, *args, **kwargs)

    monkeypatch.setattr(statistics_pass.ReferenceObserver, "_record", recording)
    monkeypatch.setattr(statistics_pass.ReferenceObserver, "backward", first_backward)
    torch.manual_seed(0)
    graph = build_graph(LoadedModel(_Model().eval(), (torch.randn(2, 3, 12, 12),), "model", None),
                        CheckOptions(modes=("bf16",), capture="function-mode"))
    return alive, graph


def test_values_no_backward_pass_reads_are_freed_before_the_passes(monkeypatch):
    alive, graph = _alive_at_backward(monkeypatch)
    read = set(alive.pop("read by the passes")[1])
    assert any(fn == "argmax" for fn, _ in alive.values())
    for name, (fn, held) in alive.items():
        if name in read:
            assert held, name  # a value the gains read is there for them
        else:
            assert not held, f"{name} ({fn}) is still held when the backward passes run"
    # the passes still ran and weighed the conv's output
    assert any(n.record(Gains) is not None and n.record(Gains).out > 0 for n in graph.nodes if n.fn == "conv2d")
