"""The gains the reference pass records (Gains) weigh each rounding on its way to the output."""
import math

import pytest
import torch

from preclint.core.notes import texts
from preclint.core.ir import Kind, Node
from preclint.reference.analyses.gains import Gains
from preclint.predict.error_model import amplification, passed_on, propagated_error
from tests.helpers import check, codes


def test_a_constants_exact_rounding_is_what_reaches_the_output():
    """A constant whose rounding errors are known exactly (Gains.rounding) puts that error on the
    output; its result-rounding estimate is only for values downstream of it with other gains."""
    node = Node("c", Kind.CONSTANT, "torch.arange", fn="arange")
    node.put(Gains(out=4.0, rounding={"fp16": 1e-6}))
    terms = {"result": 1e-3, "result_to_output": 1e-6}
    assert propagated_error(node, terms, None) == 1e-6
    assert propagated_error(node, terms, (9.0, None)) == (1e-3) ** 2 * 9.0


def test_a_node_without_gains_adds_nothing():
    node = Node("x", Kind.ELEMENTWISE, "operator.add", fn="add")
    assert propagated_error(node, {"result": 1e-3}, None) == 0.0
    assert propagated_error(node, {"result": 1e-3}, (2.0, None)) == (1e-3) ** 2 * 2.0


# ---------------------------------------------------------------- operands spread over many outputs

class _Squeeze(torch.nn.Module):
    """A squeeze-and-excitation block: a gate per channel, broadcast over the image, then pooled. The
    gate's gradient sums the 32x32 positions it scales, which agree in sign (the pooling after it)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Conv2d(8, 8, 1)

    def forward(self, x):
        h = torch.relu(self.conv(x))
        gate = torch.sigmoid(self.fc(h.mean((2, 3), keepdim=True)))
        return (h * gate).mean((2, 3))


class _RelativeAttention(torch.nn.Module):
    """Window attention with a relative-position bias table (169 entries per head) gathered into the
    49x49 attention maps of 16 windows (maxvit, coatnet, swin); ``shared``: a common component of queries and keys that makes
    every score large and their differences small (a real amplifier at the softmax)."""

    def __init__(self, shared: float):
        super().__init__()
        torch.manual_seed(0)
        self.q = torch.nn.Linear(32, 32)
        self.k = torch.nn.Linear(32, 32)
        self.table = torch.nn.Parameter(torch.randn(169, 2))
        coords = torch.stack(torch.meshgrid(torch.arange(7), torch.arange(7), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + 6
        self.register_buffer("index", rel[..., 0] * 13 + rel[..., 1])
        with torch.no_grad():
            common = torch.randn(32)
            self.q.bias.copy_(common * shared)
            self.k.bias.copy_(common * shared)

    def forward(self, x):
        q = self.q(x).view(16, 49, 2, 16).transpose(1, 2)
        k = self.k(x).view(16, 49, 2, 16).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / 4.0
        bias = self.table[self.index].permute(2, 0, 1)  # (heads, 49, 49), shared by the 16 windows
        return torch.softmax(scores + bias, dim=-1)


def _node(graph, fn):
    return next(n for n in graph.nodes if n.fn == fn)


@pytest.mark.slow
def test_a_gate_broadcast_over_the_image_does_not_amplify():
    report, graph, _ = check(_Squeeze(), (torch.rand(1, 8, 32, 32),), select=["PCL204"])
    assert "PCL204" not in codes(report)
    mul = _node(graph, "mul")
    gate = _node(graph, "sigmoid").name
    relu = _node(graph, "relu").name
    # per output element: the gate's gain is that of one of its 1024 outputs, like the activation's
    assert set(mul.record(Gains).by_input) == {gate, relu}
    assert mul.record(Gains).by_input[gate] < 3 * mul.record(Gains).out
    assert amplification(mul) < 3


@pytest.mark.slow
def test_a_real_amplifier_beside_a_gathered_bias_table_is_still_reported():
    """Scores that share a large common component amplify at the softmax; per-input gains keep that."""
    x = torch.randn(16, 49, 32)
    report, _, _ = check(_RelativeAttention(0.0), (x,), select=["PCL204"])
    assert "PCL204" not in codes(report)
    report, _, _ = check(_RelativeAttention(4.0), (x,), select=["PCL204"])
    assert [f.node for f in report.findings if f.code == "PCL204"] == ["softmax"]


def test_each_inputs_error_is_weighed_by_its_own_gain():
    """An op that amplifies its gate 100 times passes the error of the activation beside it on 1:1."""
    node = Node("mul", Kind.ELEMENTWISE, "operator.mul", fn="mul", inputs=("h", "gate"))
    node.put(Gains(out=1.0, inputs=101.0, by_input={"h": 1.0, "gate": 100.0}))
    assert passed_on(node, {"h": 1e-3, "gate": 0.0}) == 1e-3
    assert math.isclose(passed_on(node, {"h": 0.0, "gate": 1e-3}), 1e-2)
    # an input without a gain of its own (detached from autograd): amplified as the op amplifies the others
    detached = Node("sub", Kind.ELEMENTWISE, "operator.sub", fn="sub", inputs=("a", "b"))
    detached.put(Gains(out=1.0, inputs=100.0, by_input={"b": 100.0}))
    assert math.isclose(passed_on(detached, {"a": 1e-3, "b": 0.0}), 1e-2)
    # without per-input gains: the largest incoming error times the op's amplification
    node.record(Gains).by_input = {}
    assert math.isclose(passed_on(node, {"h": 1e-3, "gate": 0.0}), 1e-3 * math.sqrt(101.0))


class _Routed(torch.nn.Module):
    """A mixture-of-experts router as transformers' grouped experts count tokens: float counts (made
    from no value that requires a gradient) summed up with ``cumsum(..., dtype=torch.int32)``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate = torch.nn.Linear(8, 4)

    def forward(self, x):
        logits = self.gate(x)
        chosen = logits.topk(2, dim=-1).indices
        counts = torch.histc(chosen.float(), bins=4, min=0, max=3)
        offsets = torch.cumsum(counts, dim=0, dtype=torch.int32)
        return logits * offsets[-1]


def test_an_integer_cumsum_of_counts_keeps_the_gradients():
    report, graph, _ = check(_Routed(), (torch.randn(16, 8),))
    assert not any("without gradients" in note for note in texts(graph.notes)), texts(graph.notes)
    assert _node(graph, "linear").record(Gains) is not None


class _Shortlist(torch.nn.Module):
    """Keeps the 4 best of 16 scores: the 4 lie within 1e-6 of each other, far above the rest
    (``boundary`` False), or the 4th lies within 1e-6 of the 5th (True)."""

    def __init__(self, boundary: bool):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(16))
            self.proj.bias.zero_()
        self.boundary = boundary

    def forward(self, x):
        scores = self.proj(x)
        return scores.topk(4, dim=-1).indices


def _shortlist_scores(boundary: bool) -> torch.Tensor:
    best = [10.0, 10.0 + 1e-6, 10.0 + 2e-6, 10.0 + 3e-6]
    rest = [float(i) / 2 for i in range(12)]  # 0 ... 5.5
    if boundary:
        rest[-1] = 10.0 - 1e-6
    return torch.tensor([best + rest])


def test_top_k_flips_when_the_chosen_set_can_change_not_their_order():
    for boundary in (False, True):
        report, _, _ = check(_Shortlist(boundary), (_shortlist_scores(boundary),), select=["PCL301"])
        assert ("PCL301" in codes(report)) is boundary


def test_gradient_sums_left_on_the_device_are_the_ones_read_at_once():
    """On a GPU the backward passes' squared products stay on the device until the pass ends
    (analyses.gains.GainSums defers them); the sums are those read hook by hook, an intended infinity
    (a -inf mask, gradient 0) included, and a sum beyond float32's range taken in float64."""
    from preclint.reference.analyses.gains import GainSums

    generator = torch.Generator().manual_seed(0)
    cases = [
        (torch.randn(1000, generator=generator), torch.randn(1000, generator=generator)),
        (torch.zeros(50), torch.tensor([-math.inf] * 10 + [1.0] * 40)),  # 0 * -inf is no error
        (torch.full((8,), 3e19), torch.full((8,), 3e19)),  # (grad * value)^2 overflows float32
    ]
    now, later = GainSums(defer=False), GainSums(defer=True)
    for sink in (now, later):
        for i, (grad, value) in enumerate(cases):
            sink.add(sink.out, f"n{i}", grad, value)
            sink.add(sink.out, "all", grad, value)
    assert later.out == {} and len(later.queued) == 6  # nothing read before the pass ends
    later.resolve()
    assert set(later.out) == set(now.out)
    for key, total in now.out.items():
        assert math.isfinite(total)
        assert later.out[key] == pytest.approx(total, rel=1e-6), key


# ---------------------------------------------------------------- one product per gradient of a value


def _counting_products(monkeypatch):
    """GainSums with its products counted (the multiplications of a gradient by its values)."""
    from preclint.reference.analyses import gains

    made = []
    real = torch.Tensor.reshape

    def reshape(self, *shape):
        made.append(1)
        return real(self, *shape)

    monkeypatch.setattr(torch.Tensor, "reshape", reshape)
    return gains.GainSums(defer=False), made


def test_the_same_gradient_of_the_same_values_is_multiplied_once(monkeypatch):
    """An operand view's gradient passes unchanged to the value it views: the second sum is the
    first figure, without a second product."""
    sums, made = _counting_products(monkeypatch)
    value, grad = torch.randn(4, 5), torch.randn(4, 5)
    sums.add(sums.operands, 1, grad.view_as(grad), value.view_as(value))
    sums.add(sums.out, "x", grad, value)
    assert len(made) == 1
    product = (grad * value).reshape(-1)
    assert sums.operands[1] == sums.out["x"] == float(product.dot(product))


@pytest.mark.parametrize("change", ["grad written", "value written", "other layout", "other values"])
def test_a_gradient_or_values_that_differ_get_their_own_product(monkeypatch, change):
    sums, made = _counting_products(monkeypatch)
    value, grad = torch.randn(6, 6), torch.randn(6, 6)
    sums.add(sums.operands, 1, grad, value)
    if change == "grad written":
        grad.mul_(2.0)
    elif change == "value written":
        value.add_(1.0)
    elif change == "other layout":
        grad, value = grad.t(), value.t()
    else:
        value = torch.randn(6, 6)
    sums.add(sums.out, "x", grad, value)
    assert len(made) == 2
    product = (grad * value).reshape(-1)
    assert sums.out["x"] == float(product.dot(product))


# ---------------------------------------------------------------- one leaf read by several calls

class _Cell(torch.nn.Module):
    """One Linear called at every step of a loop (a recurrent cell's input projection), reading its
    weights each time and a step of the input: the weight is rounded once, the same cast at every call."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(8, 6)

    def forward(self, x):
        h = torch.zeros(x.shape[1], 6)
        for i in range(x.shape[0]):
            h = torch.tanh(self.lin(x[i]) + h)
        return h


def test_a_weight_read_at_every_step_is_one_rounding_not_one_per_call():
    """Each call's operand gain is its own activation's, plus its part of the weight's: the weight's error
    reaches the output through the sum of the calls' gradients (one rounding, coherent over the calls),
    not once per call with the whole gradient (which charged a 4-step loop 4 times the weight's gain)."""
    x = torch.randn(4, 5, 8)
    cell = _Cell()
    _, graph, _ = check(cell, (x,), precisions=("bf16",))
    gains = [n.record(Gains).operands for n in graph.nodes if n.kind == Kind.LINEAR]
    # the same sums from plain autograd, along the directions the reference pass draws (seed 0, as many
    # as make 64 output elements): each call gets views of its own weight and activation
    w, b = cell.lin.weight.detach(), cell.lin.bias.detach()
    views, steps = [], []
    h = torch.zeros(5, 6)
    for i in range(4):
        wi, xi = w.clone().requires_grad_(), x[i].clone().requires_grad_()
        views.append(wi)
        steps.append(xi)
        h = torch.tanh(torch.nn.functional.linear(xi, wi, b) + h)
    generator = torch.Generator().manual_seed(0)
    probes = math.ceil(64 / h.numel())
    activations, coherent = torch.zeros(4, dtype=torch.float64), 0.0
    for _ in range(probes):
        v = torch.randn(h.shape, generator=generator)
        grads = torch.autograd.grad(h, views + steps, v, retain_graph=True)
        for i in range(4):
            activations[i] += float((grads[4 + i] * x[i]).pow(2).sum())
        coherent += float((sum(grads[:4]) * w).pow(2).sum())
    units = probes * h.numel()
    expected = [float(a) / units + coherent / units / 4 for a in activations]
    assert len(gains) == 4
    for got, want in zip(gains, expected):
        assert math.isclose(got, want, rel_tol=1e-4)
