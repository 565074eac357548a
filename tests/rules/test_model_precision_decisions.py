"""The model's own precision decisions and the values it discards, as predictions and rules see them.

Autocast regions the model's code sets (``torch.autocast(enabled=False)``, a region's own dtype,
``custom_fwd(cast_inputs=...)``), values it masks (``where``, ``masked_fill``, finfo.min masks that
softmax turns into zeros) and module calls counted once in the top contributors.
"""
import pytest
import torch

from preclint.capture.graph import capture
from preclint.core.numerics import MODES
from preclint.probe import ProbeOptions, measure_model
from preclint.predict.error_model import predict_mode
from preclint.reference.statistics_pass import ReferenceObserver
from tests.helpers import check, codes


class _Double(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda", cast_inputs=torch.float32)
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    @torch.amp.custom_bwd(device_type="cuda")
    def backward(ctx, grad):
        return grad * 2.0


class _DoubleInherit(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cuda")
    def forward(ctx, x):
        return x * 2.0

    @staticmethod
    def backward(ctx, grad):
        return grad * 2.0


class _Projected(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)


class Regions(_Projected):
    """A linear outside any region; inside autocast(enabled=False) a matmul of .float() operands, and in
    it a region of its own dtype; custom autograd functions with and without cast_inputs."""

    def forward(self, x):
        h = self.proj(x)
        with torch.autocast("cpu", enabled=False):
            off = h.float() @ h.float().transpose(-2, -1)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                inner = off @ off
        return _Double.apply(h).sum() + _DoubleInherit.apply(h).sum() + inner.sum()


def _formats(graph, mode):
    prediction = predict_mode(graph, MODES[mode])
    return {n.name: prediction.nodes[n.name].fmt for n in graph.nodes}, prediction


def _by_fn(graph, fn):
    return [n for n in graph.nodes if n.fn == fn]


def test_regions_are_recorded_on_both_capture_paths():
    for path in ("fx", "function-mode"):
        graph, _ = capture(Regions(), (torch.randn(4, 16),), "regions", ReferenceObserver(), force=path)
        assert graph.capture == path
        off, inner = _by_fn(graph, "matmul")
        assert off.autocast is not None and off.autocast.enabled is False, path
        assert inner.autocast.enabled and inner.autocast.dtype == "bfloat16" and inner.autocast.outer == off.autocast
        doubled, inherited = _by_fn(graph, "mul")[:2]
        assert doubled.autocast.cast_inputs == "float32", path
        assert inherited.autocast is None, path  # custom_fwd without cast_inputs runs as its caller
        assert graph.nodes[1].autocast is None  # the linear outside every region


def test_predictions_follow_the_regions_the_code_sets():
    graph, _ = capture(Regions(), (torch.randn(4, 16),), "regions", ReferenceObserver(), force="fx")
    formats, _ = _formats(graph, "fp16")
    off, inner = _by_fn(graph, "matmul")
    doubled, inherited = _by_fn(graph, "mul")[:2]
    assert formats["proj"] == "fp16"
    assert formats[off.name] == "fp32"  # autocast off, float32 operands: no rounding at all
    assert formats[inner.name] == "bf16"  # the region's own dtype under an fp16 target
    assert formats[doubled.name] == "fp32"  # custom_fwd cast the fp16 input to float32
    assert formats[inherited.name] == "fp16"
    formats, prediction = _formats(graph, "tf32")
    assert formats[inner.name] == "bf16"  # a region the model enables applies under tf32 too
    assert prediction.nodes[off.name].local > 0  # ... and autocast(enabled=False) leaves TF32 on


def test_autocast_off_without_a_cast_computes_in_the_dtype_it_gets():
    class Forgot(_Projected):
        def forward(self, x):
            h = self.proj(x)
            with torch.autocast("cpu", enabled=False):
                return (h @ h.transpose(-2, -1)).softmax(-1)  # h is float16 under autocast: so is this

    graph, _ = capture(Forgot(), (torch.randn(4, 16),), "forgot", ReferenceObserver())
    formats, _ = _formats(graph, "fp16")
    assert formats[_by_fn(graph, "matmul")[0].name] == "fp16"


def test_promotion_takes_the_widest_format():
    class Mixed(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)
            self.register_buffer("table", torch.randn(4, 8))

        def forward(self, x):
            h = self.proj(x)  # float16 under autocast
            return torch.cat([h, self.table], dim=0), h + self.table[:1], h * 2.0

    graph, _ = capture(Mixed(), (torch.randn(4, 8),), "mixed", ReferenceObserver())
    formats, _ = _formats(graph, "fp16")
    assert formats[_by_fn(graph, "cat")[0].name] == "fp32"
    assert formats[_by_fn(graph, "add")[0].name] == "fp32"
    assert formats[_by_fn(graph, "mul")[0].name] == "fp16"


def test_a_region_entered_only_when_autocast_is_on_is_seen():
    def maybe_autocast(device_type, enabled):
        # transformers' helper: a region only where autocast is already on (as under the user's target)
        if torch.is_autocast_enabled(device_type) or enabled:
            return torch.autocast(device_type, enabled=enabled)
        import contextlib
        return contextlib.nullcontext()

    class Upcast(_Projected):
        def forward(self, x):
            h = self.proj(x)
            with maybe_autocast(x.device.type, enabled=False):
                scores = h.float() @ h.float().transpose(-2, -1)
            assert not torch.is_autocast_enabled("cpu")  # other code is told the truth
            return scores.softmax(-1)

    original = torch.is_autocast_enabled
    graph, _ = capture(Upcast(), (torch.randn(4, 16),), "upcast", ReferenceObserver())
    formats, _ = _formats(graph, "bf16")
    assert formats[_by_fn(graph, "matmul")[0].name] == "fp32"
    assert torch.is_autocast_enabled is original  # put back after the capture


@pytest.mark.slow
def test_the_emulated_probe_runs_the_region_as_the_code_sets_it():
    from preclint.rules.model.integer_precision import _angles_autocast_off, _einsum_angles, _rotary

    def build(region):
        return _rotary(_angles_autocast_off if region else _einsum_angles, length=1024)()

    measured = {}
    for region in (True, False):
        module, inputs = build(region)
        report, graph, ctx = check(module, inputs, precisions=("bf16",))
        assert ("PCL104" in codes(report)) is not region
        result = measure_model(module, inputs, graph, ("bf16",), ProbeOptions(device="cpu"), None)
        measured[region] = result.modes["bf16"].output.rel_error
    assert measured[True] < 0.02 < measured[False]  # bf16 positions up to 1023 wreck the angles


# ------------------------------------------------------------------------------ discarded values


def _t5():
    from transformers import T5Config, T5ForConditionalGeneration

    class T5(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = T5ForConditionalGeneration(
                T5Config(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=512, d_kv=16))

        def forward(self, input_ids, decoder_input_ids):
            return self.inner(input_ids=input_ids, decoder_input_ids=decoder_input_ids).logits

    torch.manual_seed(0)
    return T5(), (torch.randint(0, 512, (2, 12)), torch.randint(0, 512, (2, 6)))


@pytest.mark.slow
def test_t5_masks_and_discarded_log_are_not_errors():
    """T5 takes log(0) for its relative-position buckets (dropped by torch.where) and masks attention
    with finfo(float32).min, which float16 stores as -inf and softmax turns into zeros."""
    report, graph, ctx = check(*_t5(), precisions=("fp16", "bf16"))
    assert not {"PCL002", "PCL101", "PCL102"} & codes(report), [f.message for f in report.findings]
    for mode in ("fp16", "bf16"):
        assert report.summary[mode]["predicted_output"]["finite"]


def test_masked_values_keep_the_rules_teeth():
    class Buckets(torch.nn.Module):
        def forward(self, x):
            return x + torch.log(torch.arange(x.shape[-1]).float())  # log(0) reaches the output

    report, _, _ = check(Buckets(), (torch.randn(2, 8),))
    assert "PCL002" in codes(report)


# ------------------------------------------------------------------------------ top contributors


@pytest.mark.slow
def test_a_module_called_twice_is_one_contributor():
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.block = torch.nn.Linear(32, 32)
            self.head = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.head(torch.relu(self.block(torch.relu(self.block(x)))))

    torch.manual_seed(0)
    report, graph, ctx = check(Shared(), (torch.randn(8, 32),), precisions=("bf16",))
    top = report.summary["bf16"]["top_layers"]
    modules = [entry["module"] for entry in top]
    assert modules.count("block") == 1 and "head" in modules
    calls = [n.name for n in graph.nodes if n.module_path == "block"]
    shares = ctx.predictions["bf16"].contributions
    assert len(calls) == 2
    entry = next(e for e in top if e["module"] == "block")
    assert abs(entry["share"] - sum(shares[c] for c in calls)) < 1e-3


class _LayerScale(torch.nn.Module):
    """ConvNeXt's layer scale: a float32 parameter of one dim times a float16 activation; and a scalar
    (zero-dim) parameter, which type promotion does not let widen a tensor of one or more dims."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.gamma = torch.nn.Parameter(torch.full((8,), 1e-6))
        self.scalar = torch.nn.Parameter(torch.tensor(0.5))

    def forward(self, x):
        h = self.proj(x)
        return self.gamma * h, h * self.scalar


def test_an_fp32_parameter_times_an_fp16_activation_is_fp32_under_autocast():
    for path in ("fx", "function-mode"):
        graph, _ = capture(_LayerScale(), (torch.randn(4, 8),), "scale", ReferenceObserver(), force=path)
        formats, _ = _formats(graph, "fp16")
        scaled, halved = _by_fn(graph, "mul")
        assert formats[scaled.name] == "fp32", path  # what torch.autocast computes: float32
        if path == "function-mode":
            assert formats[halved.name] == "fp16"
        formats, _ = _formats(graph, "fp16-full")
        assert formats[scaled.name] == "fp16", path  # a cast model holds the parameter in float16 too
    with torch.autocast("cpu", dtype=torch.float16):
        scaled, halved = _LayerScale()(torch.randn(4, 8))
    assert (scaled.dtype, halved.dtype) == (torch.float32, torch.float16)
