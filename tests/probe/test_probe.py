"""The probe on the CPU (emulated precisions) on small real models: what it measures, and that the
measurements are right.

Reference values here are computed independently of the probe, by writing out what each precision
does to a single layer; tolerances say why they are what they are.
"""
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from preclint.core.notes import texts
from preclint.core.errors import UserError
from preclint.core.numerics import C_INPUT
from preclint.predict.accumulation import terms_rms
from preclint.probe import ProbeOptions, measure_model, merge_into_report, tolerance_of
from preclint.measure.rounding import round_tf32
from tests.helpers import check

CPU = ProbeOptions(device="cpu")


def probe(model, inputs, modes=("tf32", "fp16", "bf16"), options=CPU, **check_options):
    report, graph, ctx = check(model, inputs, precisions=modes, **check_options)
    result = measure_model(model, inputs, graph, modes, options, tolerance_of(ctx.rtol, ctx.atol))
    return report, graph, ctx, result


def small_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10),
    ).eval()
    return model, (torch.rand(2, 3, 16, 16),)


@pytest.fixture(scope="module")
def cnn_probe():
    model, inputs = small_cnn()
    return probe(model, inputs, modes=("tf32", "fp16", "bf16", "fp16-full"), options=ProbeOptions(device="cpu", ablate=True))


@pytest.mark.slow
def test_every_node_is_measured_in_every_mode(cnn_probe):
    _report, graph, _ctx, result = cnn_probe
    for mode, measure in result.modes.items():
        assert measure.error is None, measure.error
        assert measure.output is not None and measure.output_finite
        for node in graph.nodes:
            if node.kind == "output":
                continue
            m = measure.nodes[node.name]
            assert m.received is not None and m.received.rel_error >= 0, (mode, node.name)
            assert m.local is not None, (mode, node.name, m.note)
    assert result.environment["emulated"] is True
    assert result.environment["reference"]["dtype"] == "float64"
    assert "torch.get_float32_matmul_precision()" in result.environment["flags"]


@pytest.mark.slow
def test_local_error_of_a_dot_product_has_the_size_of_its_format(cnn_probe):
    # docs/error-model.md: over whole layers the measured local error of a conv/linear was within 3x of
    # C_INPUT * u * RMS(sqrt(sum (a b)^2)); the exact emulation must land in the same band.
    _report, graph, _ctx, result = cnn_probe
    u = {"tf32": 2.0 ** -11, "fp16": 2.0 ** -11, "fp16-full": 2.0 ** -11, "bf16": 2.0 ** -8}
    for mode in ("tf32", "bf16"):
        for node in graph.nodes:
            if node.kind not in ("conv", "linear") or not terms_rms(node):
                continue
            if mode == "tf32" and not result.modes[mode].nodes[node.name].tf32_applied:
                continue  # a kernel without TF32 (the 3-channel stem): float32's error
            local = result.modes[mode].nodes[node.name].local
            local_rms = local.rel_error * node.out.rms
            size = C_INPUT * u[mode] * terms_rms(node)
            assert size / 3 <= local_rms <= 3 * size, (mode, node.name, local_rms, size)


def test_data_movement_adds_no_error_and_tf32_leaves_other_ops_alone(cnn_probe):
    _report, graph, _ctx, result = cnn_probe
    for node in graph.nodes:
        m = result.modes["tf32"].nodes.get(node.name)
        if m is None:
            continue
        if node.kind == "shape":
            assert m.local.rel_error == 0.0
        if node.kind in ("batchnorm", "activation", "pool"):
            # these run in float32 under TF32: only float32 rounding against the float64 reference
            assert m.local.rel_error < 1e-6, (node.name, m.local.rel_error)


def test_exact_ops_add_no_error_in_any_mode(cnn_probe):
    # max(x, 0) is exact in every format: a replay of the ReLU on its reference input rounded to
    # the run's dtype would show only that rounding (float32's, 2.5e-8, against the float64 values
    # the ablation keeps), which belongs to the batch norm that produced the input
    _report, graph, _ctx, result = cnn_probe
    relus = [n.name for n in graph.nodes if n.fn == "relu"]
    assert len(relus) == 2
    for mode, measure in result.modes.items():
        for name in relus:
            assert measure.nodes[name].local.rel_error == 0.0, (mode, name)
            assert measure.nodes[name].received.rel_error > 0.0, (mode, name)
        assert measure.nodes["_1"].local.rel_error > 0.0 or mode == "tf32", mode


@pytest.mark.slow
def test_reference_values_are_kept_in_float32_unless_the_ablation_needs_float64():
    from preclint.measure.copies import copy_to
    from preclint.measure.program import Program
    from preclint.probe.reference_pass import reference_pass, resolve_reference

    model, inputs = small_cnn()
    _report, graph, _ctx = check(model, inputs, precisions=("fp16",))
    model64 = copy_to(model, torch.device("cpu"), torch.float64)
    inputs64 = tuple(x.double() for x in inputs)
    kept = {}
    for keep_float64 in (False, True):
        ref = reference_pass(Program(graph, model), model64, inputs64, keep_float64)
        resolve_reference(ref)
        kept[keep_float64] = ref
        dtypes = {t.dtype for values in ref.values.values() for t in values if t.is_floating_point()}
        assert dtypes == ({torch.float64} if keep_float64 else {torch.float32})
        assert bool(ref.raw) == keep_float64  # the ablation re-runs from the float64 values
    for name in kept[True].order:
        # norms are those of the float64 values to float32's precision (the rounding is 2^-24)
        assert kept[False].norm(name, 0) == pytest.approx(kept[True].norm(name, 0), rel=1e-6)
        assert torch.equal(kept[False].values[name][0], kept[True].values[name][0].float())
    assert kept[False].output.dtype == torch.float64  # output errors are taken against float64


def test_contributions_match_one_node_at_a_time_runs(cnn_probe):
    _report, _graph, _ctx, result = cnn_probe
    for mode, measure in result.modes.items():
        a = measure.agreement
        assert a is not None and a["nodes"] >= 4, mode
        # the adjoint is the exact runs' first-order term: for errors of 1e-3 the rest is 1e-3 of it
        assert a["correlation"] > 0.999, (mode, a)
        assert a["max_abs_difference"] < 0.01, (mode, a)
        assert a["top5_overlap"] >= 0.8, (mode, a)
        # a shallow network: first-order propagation of the local errors is nearly all of the error
        assert 0.9 < measure.explained < 1.1, (mode, measure.explained)


@pytest.mark.slow
def test_amplification_of_a_pure_gain_is_the_gain():
    # y = 8 x after a conv: the relative error passes through unchanged (amplification 1), and the
    # scaling itself adds float32 rounding only under TF32
    torch.manual_seed(0)

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(8, 8, 3)

        def forward(self, x):
            return self.conv(x) * 8.0

    _r, graph, _c, result = probe(Scaled().eval(), (torch.rand(2, 8, 12, 12),), modes=("tf32",))
    mul = [n for n in graph.nodes if n.fn == "mul"][0]
    assert result.modes["tf32"].nodes[mul.name].amplification == pytest.approx(1.0, rel=1e-3)


@pytest.mark.slow
def test_emulated_autocast_matches_a_hand_written_float16_linear():
    # autocast float16 on Linear: operands and bias rounded to float16, float32 accumulation, result
    # stored in float16. Written out by hand, the output error must equal the probe's to float32's
    # resolution (the two computations differ only in the order of the float32 sums).
    torch.manual_seed(0)
    layer = nn.Linear(64, 32).eval()
    x = torch.randn(16, 64)
    _r, _g, _c, result = probe(layer, (x,), modes=("fp16", "fp16-full", "bf16"))
    with torch.no_grad():
        reference = torch.nn.functional.linear(x.double(), layer.weight.double(), layer.bias.double())
    for mode, dtype in (("fp16", torch.float16), ("fp16-full", torch.float16), ("bf16", torch.bfloat16)):
        r = lambda t: t.detach().to(dtype).float()  # noqa: E731
        by_hand = torch.nn.functional.linear(r(x), r(layer.weight), r(layer.bias)).to(dtype).double()
        expected = float((by_hand - reference).norm() / reference.norm())
        measured = result.modes[mode].output.rel_error
        assert measured == pytest.approx(expected, rel=1e-3), mode


@pytest.mark.slow
def test_emulated_tf32_matches_a_hand_written_tf32_conv():
    torch.manual_seed(0)
    conv = nn.Conv2d(8, 8, 3).eval()
    x = torch.randn(2, 8, 10, 10)
    _r, graph, _c, result = probe(conv, (x,), modes=("tf32",))
    with torch.no_grad():
        reference = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double())
        by_hand = torch.nn.functional.conv2d(round_tf32(x), round_tf32(conv.weight), conv.bias).double()
    expected = float((by_hand - reference).norm() / reference.norm())
    assert result.modes["tf32"].output.rel_error == pytest.approx(expected, rel=1e-3)
    node = [n for n in graph.nodes if n.kind == "conv"][0]
    assert result.modes["tf32"].nodes[node.name].tf32_applied is True


@pytest.mark.slow
def test_emulated_tf32_follows_the_kernels_an_h200_picks():
    # depthwise convs, convs over <= 4 channels and single-row products ran without TF32 on an H200
    # (benchmarks/README.md); the emulation leaves them in float32, a dense conv gets TF32
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.Conv2d(16, 16, 3, groups=16), nn.Conv2d(16, 16, 3),
                          nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 4)).eval()
    _r, graph, _c, result = probe(model, (torch.rand(1, 3, 12, 12),), modes=("tf32",))
    applied = {n.module_path: result.modes["tf32"].nodes[n.name].tf32_applied
               for n in graph.nodes if n.kind in ("conv", "linear")}
    assert applied == {"0": False, "1": False, "2": True, "5": False}


@pytest.mark.slow
def test_tf32_applied_is_false_where_rounding_to_tf32_changes_nothing():
    # small integers are exact in TF32, so the conv's error is float32's (here: none), which the
    # probe must tell apart from a TF32 kernel, as it does for depthwise convs on cuDNN
    conv = nn.Conv2d(8, 4, 3, bias=False).eval()
    with torch.no_grad():
        conv.weight.copy_(torch.randint(-3, 4, conv.weight.shape).float())
    x = torch.randint(-4, 5, (2, 8, 8, 8)).float()
    _r, graph, _c, result = probe(conv, (x,), modes=("tf32",))
    node = [n for n in graph.nodes if n.kind == "conv"][0]
    assert result.modes["tf32"].nodes[node.name].tf32_applied is False


def test_tf32_rounding_is_to_nearest_even_with_10_mantissa_bits():
    values = torch.tensor([1.0, 1 + 2 ** -11, 1 + 3 * 2 ** -11, 1 + 2 ** -10 + 2 ** -11, -(1 + 3 * 2 ** -11),
                           float("inf"), -float("inf"), 3.4028234e38])
    expected = [1.0, 1.0, 1 + 2 ** -9, 1 + 2 ** -9, -(1 + 2 ** -9), float("inf"), -float("inf"), float("inf")]
    assert round_tf32(values).tolist() == expected
    assert math.isnan(float(round_tf32(torch.tensor([float("nan")]))))


@pytest.mark.slow
def test_overflow_under_fp16_is_measured_and_confirms_pcl101():
    from preclint.rules.model.fp16_overflow import Fp16Overflow

    model, inputs = Fp16Overflow.bad[0].build()
    report, graph, ctx, result = probe(model, inputs, modes=("fp16", "bf16"))
    measure = result.modes["fp16"]
    assert measure.output_finite is False
    assert measure.first_nonfinite is not None
    assert result.modes["bf16"].output_finite is True
    merge_into_report(report, ctx, result)
    flagged = [f for f in report.findings if f.code == "PCL101"]
    assert flagged and all(f.status == "confirmed" for f in flagged)
    assert report.summary["fp16"]["measured_output"]["finite"] is False


@pytest.mark.slow
def test_decision_flips_are_measured_for_pcl301():
    from preclint.rules.model.decision_flip import DecisionFlip

    model, inputs = DecisionFlip.bad[0].build()
    report, graph, ctx, result = probe(model, inputs, modes=("bf16",))
    merge_into_report(report, ctx, result)
    argmax = [n for n in graph.nodes if n.fn == "argmax"][0]
    m = result.modes["bf16"].nodes[argmax.name]
    assert m.units == 64 and m.flips is not None
    # the flips are the labels that differ from the float64 reference's, counted independently here
    with torch.no_grad():
        ref = model.double()(inputs[0].double())
    assert result.modes["bf16"].output_units == ref.numel()
    assert result.modes["bf16"].output_flips == m.flips
    for f in report.findings:
        if f.code == "PCL301":
            assert f.measured["bf16"].flip_fraction == pytest.approx(m.flips / 64)
            assert f.status == ("confirmed" if m.flips else "refuted")


@pytest.mark.slow
def test_pcl001_gets_the_smallest_passing_tolerance():
    from preclint.rules.model.output_tolerance import OutputTolerance

    model, inputs = OutputTolerance.bad[0].build()
    report, graph, ctx, result = probe(model, inputs, modes=("fp16-full",), rtol=1e-3, atol=1e-5)
    merge_into_report(report, ctx, result)
    finding = [f for f in report.findings if f.code == "PCL001"][0]
    assert finding.status == "confirmed"
    figure = finding.measured["fp16-full"]
    check_ = result.modes["fp16-full"].tolerance
    assert check_.failing > 0 and figure.min_atol > 1e-5
    # recompute with the definition: every element passes |d| <= atol + rtol |ref| at the reported atol
    with torch.no_grad():
        ref = model.double()(inputs[0].double())
        low = model.half()(inputs[0].half()).double()
    d = (low - ref).abs()
    assert bool((d <= figure.min_atol * (1 + 1e-6) + 1e-3 * ref.abs()).all())
    assert not bool((d <= figure.min_atol * 0.99 + 1e-3 * ref.abs()).all())
    assert "Measured:" in finding.fix


def test_reference_that_is_not_finite_is_a_user_error():
    class Exploding(nn.Module):
        def forward(self, x):
            return torch.exp(x * 1000.0)

    with pytest.raises(UserError, match="float64 reference .* not finite"):
        probe(Exploding(), (torch.full((2, 3), 10.0),), modes=("fp16",))


def test_a_mode_that_cannot_run_is_reported_not_raised():
    class Float32Only(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            if x.dtype == torch.float16:
                raise RuntimeError("this model only takes float32 or float64 inputs")
            return self.fc(x)

    torch.manual_seed(0)
    _r, _g, _c, result = probe(Float32Only().eval(), (torch.randn(4, 8),), modes=("bf16", "fp16-full"))
    assert result.modes["bf16"].error is None
    error = result.modes["fp16-full"].error
    assert error and "only takes float32" in error and "\n" not in error


def test_out_of_memory_in_one_mode_is_a_per_mode_could_not_measure():
    class Hungry(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            if x.dtype == torch.bfloat16:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
            return self.fc(x)

    torch.manual_seed(0)
    _r, _g, _c, result = probe(Hungry().eval(), (torch.randn(4, 8),), modes=("fp16", "bf16-full"))
    assert result.modes["fp16"].error is None
    assert result.modes["bf16-full"].error.startswith("out of memory")


@pytest.mark.slow
def test_contributions_fall_back_to_float32_when_the_model_fails_under_autocast(monkeypatch):
    # on a GPU the sensitivity pass runs under bfloat16 autocast; a model that cannot must still
    # get its contributions, from a float32 pass, and the environment must say which one ran
    import preclint.probe as probe_module
    import preclint.probe.sensitivity as sensitivity_module

    real = sensitivity_module.sensitivity_pass
    calls = []

    def sensitivity_pass(program, graph, model32, inputs32, autocast=None):
        calls.append(autocast)
        if autocast is not None:
            raise RuntimeError("no bfloat16 kernel for this op")
        return real(program, graph, model32, inputs32, autocast)

    monkeypatch.setattr(sensitivity_module, "sensitivity_pass", sensitivity_pass)
    monkeypatch.setattr(probe_module, "_sensitivity_autocast", lambda device, program: torch.bfloat16)
    model, inputs = small_cnn()
    _r, _g, _c, result = probe(model, inputs, modes=("fp16",))
    assert calls == [torch.bfloat16, None]
    assert result.modes["fp16"].explained is not None
    assert not any("contributions not measured" in note for note in texts(result.notes))
    assert "autocast" not in result.environment["contributions"]


@pytest.mark.slow
def test_cuda_without_a_gpu_is_a_user_error():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    model, inputs = small_cnn()
    with pytest.raises(UserError, match="--probe cuda.*--probe cpu"):
        probe(model, inputs, modes=("tf32",), options=ProbeOptions(device="cuda"))


@pytest.mark.slow
@pytest.mark.parametrize("ablate", [False, True], ids=["float32-store", "float64-store"])
def test_models_fx_cannot_trace_are_probed_eagerly_with_their_in_place_ops(ablate):
    # data-dependent control flow (the recorder, not FX) and an in-place ReLU that would overwrite
    # the reference value of the batch norm before it if the probe did not keep a copy
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3)
            self.bn = nn.BatchNorm2d(8)
            self.relu = nn.ReLU(inplace=True)
            self.fc = nn.Linear(8, 4)

        def forward(self, x):
            y = self.relu(self.bn(self.conv(x)))
            if y.mean() > 0:  # FX cannot trace this
                y = y * 2.0
            return self.fc(y.mean(dim=(2, 3)))

    torch.manual_seed(0)
    _r, graph, _c, result = probe(Branchy().eval(), (torch.rand(2, 3, 10, 10),), modes=("fp16", "bf16"),
                                  options=ProbeOptions(device="cpu", ablate=ablate))
    assert graph.capture == "function-mode"
    for mode, measure in result.modes.items():
        assert measure.error is None and measure.diverged_at is None, (mode, measure.error)
        bn = measure.nodes["bn"]
        # the batch norm's own error is its float16 rounding (|relative| ~ u/3), not the ReLU's clipping
        assert bn.local.rel_error < 4 * 2.0 ** -8, (mode, bn.local)
        assert measure.explained == pytest.approx(1.0, abs=0.15), (mode, measure.explained)


@pytest.mark.slow
def test_casts_a_precision_adds_keep_the_run_on_the_reference_path():
    # T5's feed-forward casts its activations to the weight's dtype only when they differ, which
    # happens under autocast and never in the reference; the ops after it (another cast among them,
    # whose recorded name the added one shifts) are still compared node by node
    class CastsWhenReduced(nn.Module):
        def __init__(self):
            super().__init__()
            self.wi = nn.Linear(16, 32)
            self.wo = nn.Linear(32, 16)

        def forward(self, x):
            h = torch.relu(self.wi(x.to(torch.float32)))
            if h.dtype != self.wo.weight.dtype:
                h = h.to(self.wo.weight.dtype)
            return self.wo(h).to(torch.float32) * 2.0

    torch.manual_seed(0)
    _r, graph, _c, result = probe(CastsWhenReduced().eval(), (torch.randn(4, 16),), modes=("fp16", "bf16"))
    assert graph.capture == "function-mode"
    later_cast = [n.name for n in graph.nodes if n.fn == "to"][-1]
    for mode, measure in result.modes.items():
        assert measure.error is None and measure.diverged_at is None, (mode, measure.diverged_at)
        # wo reads the added cast's result: its operand is the reference's ReLU output
        assert measure.nodes["wo"].local is not None and measure.nodes["wo"].local.rel_error > 0, mode
        assert measure.nodes[later_cast].received is not None, mode


@pytest.mark.slow
@pytest.mark.parametrize("traceable", [True, False], ids=["fx", "function-mode"])
def test_values_an_in_place_op_overwrites_are_kept_as_they_were(traceable):
    # Mixtral's router: top-k weights computed in float32 (in the float64 reference too, so the store
    # keeps them uncopied), normalised in place after their sum was taken
    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate = nn.Linear(16, 8)

        def forward(self, x):
            weights = torch.softmax(self.gate(x), dim=-1, dtype=torch.float)
            if not traceable and x.mean() > 100:  # FX cannot trace this
                weights = weights * 2.0
            top, _ = torch.topk(weights, 2, dim=-1)
            top /= top.sum(dim=-1, keepdim=True)
            return top

    torch.manual_seed(0)
    _r, graph, _c, result = probe(Router().eval(), (torch.randn(64, 16),), modes=("fp16", "bf16"))
    assert graph.capture == ("fx" if traceable else "function-mode")
    total = next(n.name for n in graph.nodes if n.fn == "sum")
    for mode, measure in result.modes.items():
        # the sum's own rounding, replayed on the reference's top-k values (not on the normalised ones)
        assert measure.nodes[total].local.rel_error < 1e-3, (mode, measure.nodes[total].local)


@pytest.mark.slow
def test_a_mask_of_minus_inf_is_no_error():
    # causal attention: the scores hold -inf in float64 too; the same -inf in a reduced run is no error
    class Causal(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).split(16, dim=-1)
            scores = torch.matmul(q, k.transpose(-2, -1)) / 4.0
            mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
            return torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v

    torch.manual_seed(0)
    _r, graph, _c, result = probe(Causal().eval(), (torch.randn(2, 8, 16),), modes=("bf16", "fp16-full"))
    fill = [n for n in graph.nodes if n.fn == "masked_fill"][0]
    assert fill.name in result.reference_nonfinite
    for mode, measure in result.modes.items():
        m = measure.nodes[fill.name]
        assert not m.nonfinite and m.received.rel_error < 0.05 and math.isfinite(m.local.rel_error), (mode, m)
        assert measure.first_nonfinite is None and measure.output_finite


class _BranchesWithFunctionalBatchNorm(nn.Module):
    """Two conv + ``F.batch_norm`` branches added up, as timm's BatchNormAct2d computes them: under
    autocast the convs store float16 and batch_norm keeps its input's dtype (float32 weights and
    statistics do not promote it), so the sum of two 4e4-sized branches overflows float16."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(4, 4, 1, bias=False), nn.Conv2d(4, 4, 1, bias=False)
        for conv in (self.a, self.b):
            nn.init.constant_(conv.weight, 1.0)
        self.weight, self.bias = nn.Parameter(torch.ones(4)), nn.Parameter(torch.zeros(4))
        self.register_buffer("mean", torch.zeros(4))
        self.register_buffer("var", torch.ones(4))

    def forward(self, x):
        norm = lambda y: F.batch_norm(y, self.mean, self.var, self.weight, self.bias, False)  # noqa: E731
        return norm(self.a(x)) + norm(self.b(x))


@pytest.mark.slow
def test_a_sum_of_batch_norm_branches_overflows_as_autocast_runs_it():
    torch.manual_seed(0)
    model = _BranchesWithFunctionalBatchNorm().eval()
    x = torch.full((1, 4, 3, 3), 1e4)  # each branch 4e4: float16 holds it, their sum 8e4 it does not
    with torch.autocast("cpu", dtype=torch.float16), torch.no_grad():
        assert not torch.isfinite(model(x)).all()  # what autocast itself does
    report, graph, ctx, result = probe(model, (x,), modes=("fp16",))
    assert result.modes["fp16"].output_finite is False
    merge_into_report(report, ctx, result)
    flagged = [f for f in report.findings if f.code == "PCL101"]
    assert flagged and all(f.status == "confirmed" for f in flagged)


def test_a_frozen_batch_norm_stores_float32_under_autocast_as_type_promotion_does():
    from torchvision.ops import FrozenBatchNorm2d

    from preclint.core.numerics import MODES
    from preclint.predict.formats import node_format

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 1), FrozenBatchNorm2d(4)).eval()
    x = torch.randn(1, 3, 5, 5)
    with torch.autocast("cpu", dtype=torch.float16), torch.no_grad():
        assert model(x).dtype == torch.float32  # x * scale + bias, scale and bias float32
    _r, graph, _c, result = probe(model, (x,), modes=("fp16",))
    frozen = next(n for n in graph.nodes if n.module_type == "FrozenBatchNorm2d")
    convolution = next(n for n in graph.nodes if n.kind == "conv")
    assert node_format(frozen, MODES["fp16"], ["fp16"]) == "fp32"
    assert node_format(convolution, MODES["fp16"], ["fp32"]) == "fp16"
    # the emulation stores float32 too: written out by hand (the conv's operands and bias rounded to
    # float16, its result stored in float16, the frozen batch norm computed and kept in float32), the
    # output error equals the probe's to float32's resolution
    r = lambda t: t.detach().half().float()  # noqa: E731
    conv, frozen_bn = model
    with torch.no_grad():
        reference = model.double()(x.double())
        model.float()
        by_hand = frozen_bn(r(F.conv2d(r(x), r(conv.weight), r(conv.bias)))).double()
    expected = float((by_hand - reference).norm() / reference.norm())
    assert result.modes["fp16"].output.rel_error == pytest.approx(expected, rel=1e-3)


def test_a_run_without_flips_refutes_only_a_rate_under_which_that_was_unlikely():
    from preclint.core.findings import ErrorFigure
    from preclint.probe.verdict import _no_flips

    # keypointrcnn's box widths: 3.4% of 12 values predicted to move; no flip is the likelier run (66%)
    assert _no_flips(ErrorFigure(0.01, 0.1, flip_fraction=0.034), 12) is None
    # half of 64 thresholded values: a run with none flipped has probability 5e-20
    assert _no_flips(ErrorFigure(0.01, 0.1, flip_fraction=0.5), 64) == "refuted"
    # 1% of 4096 rows: 1.4e-18
    assert _no_flips(ErrorFigure(0.01, 0.1, flip_fraction=0.01), 4096) == "refuted"
    assert _no_flips(None, 12) == "refuted"  # nothing predicted per decision: no flip refutes it


def test_a_token_id_model_runs_once_for_its_gradients(monkeypatch):
    # token ids carry no gradient: the sensitivity pass takes it through the weights, and a first run
    # with the weights switched off could only find that out (a whole pass of the model in vain)
    from preclint.measure.program import Program
    import preclint.probe.sensitivity as sensitivity_module

    class Tokens(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.fc = nn.Linear(16, 8)

        def forward(self, ids):
            return self.fc(torch.tanh(self.embed(ids)))

    runs = []
    real_run = Program.run

    def counted(self, root, inputs, observer):
        runs.append(type(observer).__name__)
        return real_run(self, root, inputs, observer)

    monkeypatch.setattr(Program, "run", counted)
    torch.manual_seed(0)
    _r, _g, _c, result = probe(Tokens().eval(), (torch.randint(0, 32, (2, 6)),), modes=("fp16",))
    assert runs.count(sensitivity_module.Sensitivity.__name__) == 1
    assert result.modes["fp16"].explained is not None
    assert not any("contributions not measured" in note for note in texts(result.notes))


def test_a_mode_out_of_memory_with_the_gradients_kept_is_measured_without_them(monkeypatch):
    # the run with gradients and the error vectors kept for it are the first thing to let go when a
    # mode does not fit: the mode gets its ledger, the contributions a note
    import preclint.probe.sweep as sweep_module

    real = sweep_module.sweep
    calls = []

    def sweep(program, run, ref, graph, keep_errors):
        calls.append(keep_errors)
        if keep_errors:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return real(program, run, ref, graph, keep_errors)

    monkeypatch.setattr(sweep_module, "sweep", sweep)
    model, inputs = small_cnn()
    _r, _g, _c, result = probe(model, inputs, modes=("fp16", "bf16"))
    assert calls == [True, False, False]  # once with the gradients, then never again
    for mode in ("fp16", "bf16"):
        measured = result.modes[mode]
        assert measured.error is None and measured.output is not None and measured.nodes
        assert measured.explained is None
    assert any(note.startswith("contributions not measured from fp16 on: out of memory") for note in texts(result.notes))


def test_a_mode_that_does_not_fit_even_without_the_gradients_fails_alone(monkeypatch):
    import preclint.probe.sweep as sweep_module

    real = sweep_module.sweep
    calls = []

    def sweep(program, run, ref, graph, keep_errors):
        calls.append(keep_errors)
        if len(calls) <= 2:  # fp16, with the gradients kept and without
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 40.00 GiB")
        return real(program, run, ref, graph, keep_errors)

    monkeypatch.setattr(sweep_module, "sweep", sweep)
    model, inputs = small_cnn()
    _r, _g, _c, result = probe(model, inputs, modes=("fp16", "bf16"))
    assert calls == [True, False, False]
    assert result.modes["fp16"].error.startswith("out of memory")
    assert result.modes["bf16"].error is None and result.modes["bf16"].nodes
