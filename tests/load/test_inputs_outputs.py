"""Keyword inputs, None inputs and structured outputs through capture, the reference pass, the
predictions and the probe."""
import dataclasses

import pytest
import torch
from torch import nn

from preclint.core.notes import texts
from preclint.config import Config
from preclint.engine import CheckOptions, check_model
from preclint.core.ir import Kind
from preclint.load.loader import LoadedModel
from preclint.probe import ProbeOptions, probe_report


def run_check(module, args=(), kwargs=None, modes=("fp16",), capture=None, probe=False):
    torch.manual_seed(0)
    loaded = LoadedModel(module.eval(), tuple(args), "model", None, kwargs=dict(kwargs or {}))
    config = Config(precisions=tuple(modes))
    report, graph, ctx = check_model(loaded, config, CheckOptions(modes=tuple(modes), capture=capture))
    if probe:
        probe_report(loaded, report, ctx, config, ProbeOptions(device="cpu"))
    return report, graph


class Masked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 16)

    def forward(self, x, mask=None, scale: float = 1.0):
        y = self.fc(x) * scale
        if mask is not None:
            y = y.masked_fill(mask == 0, -1e4)
        return y.softmax(-1)


def masked():
    torch.manual_seed(2)
    return Masked()


def inputs():
    torch.manual_seed(1)
    mask = torch.ones(4, 16, dtype=torch.long)
    mask[:, -3:] = 0
    return torch.randn(4, 16), mask


def test_fx_traces_a_left_out_optional_input_as_none():
    # Before, FX traced `mask` as a value, took the mask branch, and the run failed on None.
    x, _ = inputs()
    report, graph = run_check(masked(), (x,))
    assert graph.capture == "fx"
    assert [n.name for n in graph.nodes if n.kind == Kind.INPUT] == ["x"]
    assert not any(n.fn in ("masked_fill", "_assert", "_assert_is_none", "eq") for n in graph.nodes)


def test_keyword_inputs_trace_with_fx_and_record_in_function_mode_alike():
    x, mask = inputs()
    fx_report, fx_graph = run_check(masked(), kwargs={"x": x, "mask": mask, "scale": 2.0})
    fm_report, fm_graph = run_check(masked(), kwargs={"x": x, "mask": mask, "scale": 2.0}, capture="function-mode")
    assert fx_graph.capture == "fx" and fm_graph.capture == "function-mode"
    assert [n.name for n in fx_graph.nodes if n.kind == Kind.INPUT] == ["x", "mask"]
    assert [n.name for n in fm_graph.nodes if n.kind == Kind.INPUT] == ["x", "mask"]
    assert any(n.fn == "masked_fill" for n in fx_graph.nodes)
    fx_out = fx_report.summary["fp16"]["predicted_output"]["rel_error"]
    assert fx_out == pytest.approx(fm_report.summary["fp16"]["predicted_output"]["rel_error"], rel=1e-6)
    # the same call written positionally predicts the same
    positional, _ = run_check(masked(), (x, mask, 2.0))
    assert positional.summary["fp16"]["predicted_output"]["rel_error"] == pytest.approx(fx_out, rel=1e-6)


@pytest.mark.slow
def test_the_probe_runs_keyword_inputs_and_keeps_integer_masks_integer():
    x, mask = inputs()
    for capture in ("fx", "function-mode"):
        report, _ = run_check(masked(), kwargs={"x": x, "mask": mask}, capture=capture, probe=True)
        measured = report.summary["fp16"]["measured_output"]
        assert measured["finite"] and 0 < measured["rel_error"] < 1e-2, capture


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    aux: torch.Tensor


class Structured(nn.Module):
    """Returns the same two tensors in the form ``kind`` names."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind
        self.fc = nn.Linear(16, 16)
        self.big = nn.Linear(16, 16)

    def forward(self, x):
        logits, aux = self.fc(x), self.big(x) * 100
        return {
            "tuple": lambda: (logits, aux),
            "dict": lambda: {"logits": logits, "aux": aux},
            "dataclass": lambda: Output(logits, aux),
            "detections": lambda: [{"boxes": logits, "scores": aux}],
        }[self.kind]()


def fixed_model(kind):
    torch.manual_seed(3)
    return Structured(kind)


@pytest.mark.slow
@pytest.mark.parametrize("capture", ["fx", "function-mode"])
def test_every_floating_output_counts_whatever_holds_it(capture):
    x = inputs()[0]
    figures = {}
    for kind in ("tuple", "dict", "dataclass", "detections"):
        report, graph = run_check(fixed_model(kind), (x,), capture=capture, probe=True)
        assert not [note for note in texts(report.notes) if "output" in note], texts(report.notes)
        summary = report.summary["fp16"]
        figures[kind] = (summary["predicted_output"]["rel_error"], summary["measured_output"]["rel_error"])
    # a dataclass once counted only its first field (FX) or none (function mode): a 100x smaller output
    for kind, figure in figures.items():
        assert figure == pytest.approx(figures["tuple"], rel=1e-6), kind


class Returns(nn.Module):
    def __init__(self, value):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.value = value

    def forward(self, x):
        y = self.fc(x)
        return {
            "none": lambda: None,
            "str": lambda: "done",
            "labels": lambda: y.argmax(-1),
            "mixed": lambda: (y, None, "label", 0.5),
        }[self.value]()


@pytest.mark.parametrize("value, note", [
    ("none", "the model returns None and no tensor: there is no output error to predict or measure"),
    ("str", "the model returns a str and no tensor: there is no output error to predict or measure"),
    ("labels", "the model returns only 1 integer or bool tensor: no output error is predicted; --probe counts "
               "the values that change"),
    ("mixed", "outputs that are not tensors were not compared: output[1] (None), output[2] (str), "
              "output[3] (float)"),
])
def test_outputs_nothing_compares_are_noted(value, note):
    report, _ = run_check(Returns(value), (torch.randn(2, 4),))
    assert note in texts(report.notes)
    predicted = report.summary["fp16"]["predicted_output"]["rel_error"]
    assert (predicted is not None) == (value == "mixed")


class _BufferFlag(nn.Module):
    """A forward that branches on a buffer's value: FX cannot trace that with buffer reads as graph
    values, and traces it as before (the buffer read while tracing)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("enabled", torch.tensor(True))
        self.register_buffer("scale", torch.full((8,), 2.0))

    def forward(self, x):
        if self.enabled:
            x = x * self.scale
        return self.fc(x)


def test_buffers_are_graph_values_where_the_forward_computes_with_them():
    report, graph = run_check(_BufferFlag(), (torch.randn(4, 8),))
    assert graph.capture == "fx"  # the branch on a buffer: traced without buffer reads as values
    assert any(n.fn == "mul" for n in graph.nodes)

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.register_buffer("scale", torch.full((8,), 2.0))

        def forward(self, x):
            return self.fc(x * (self.scale + 1.0).rsqrt())

    report, graph = run_check(Scaled(), (torch.randn(4, 8),))
    assert graph.capture == "fx"
    reads = [n for n in graph.nodes if n.fn == "parameter"]
    assert [n.params for n in reads] == [("scale",)]  # the buffer itself, not a constant the trace computed
    assert {"add", "rsqrt"} <= {n.fn for n in graph.nodes}
