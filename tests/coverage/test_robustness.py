"""Models that crashed the capture, the reference pass or the probe, each run as a user met it.

A signal, a traceback or a hang is a bug: the check degrades (no gradients, no probe) with a note, or
says in one line what it cannot do.
"""
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from preclint.core.notes import texts
from preclint.reference.analyses.gains import Gains
from preclint.probe import ProbeOptions, measure_model, merge_into_report
from preclint.report.json_format import to_dict
from tests.helpers import check
from tests import paths

ROOT = str(paths.ROOT)


def probe(model, inputs, modes=("bf16",)):
    report, graph, ctx = check(model, inputs, precisions=modes)
    result = measure_model(model, inputs, graph, modes, ProbeOptions(device="cpu"))
    merge_into_report(report, ctx, result)
    return report, graph, result


# ------------------------------------------------------------------ in-place writes and gradient hooks


@pytest.mark.slow
@pytest.mark.subprocess
def test_inplace_relu_then_setitem_is_checked_not_crashed(tmp_path):
    """register_hook on a view whose base was written in place since crashed torch (SIGSEGV)."""
    path = tmp_path / "model.py"
    path.write_text(textwrap.dedent("""
        import torch
        from torch import nn

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 8)

            def forward(self, x):
                y = nn.ReLU(inplace=True)(self.fc(x))
                y[:, 0] = 0.0
                return y

        model = Net()
        example_inputs = (torch.randn(4, 8),)
    """))
    result = subprocess.run([sys.executable, "-m", "preclint", "check", str(path), "--output-format", "json",
                             "--exit-zero"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, (result.returncode, result.stderr)  # was -11
    report = json.loads(result.stdout)
    assert report["capture"] == "function-mode"
    # ReLU saved the output the setitem overwrites: the reference pass keeps what autograd saved from the
    # writes that follow (reference/saved_values.py), so its backward passes run (they once failed here)
    assert not any("without gradients" in note for note in report["notes"]), report["notes"]


class _WritesIntoBase(nn.Module):
    """A view of a value, then in-place writes into the value and the view: the view's grad_fn goes stale."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        h = self.fc(x)
        v = h.view(4, 8)
        h.mul_(2)
        v[:, 0] = 1.0
        return self.out(v + 1)


class _OutOfPlace(_WritesIntoBase):
    """The same arithmetic without writing into anything."""

    def forward(self, x):
        h = self.fc(x)
        v = (h * 2).view(4, 8).clone()
        v[:, 0] = 1.0
        return self.out(v + 1)


def test_gains_of_values_written_in_place_are_those_of_the_values_as_made():
    """A hook sees the gradient of the version of a tensor it was registered on, and the values are
    kept from before the write: the gains equal those of the same model written out of place."""
    gains = []
    for cls in (_WritesIntoBase, _OutOfPlace):
        torch.manual_seed(0)
        _, graph, _ = check(cls(), (torch.randn(4, 8),))
        assert not any("without gradients" in n for n in texts(graph.notes)), texts(graph.notes)
        gains.append({n.module_path or n.fn: (n.record(Gains).out, n.record(Gains).operands)
                      for n in graph.nodes if n.fn in ("linear", "add", "setitem")})
    in_place, out_of_place = gains
    assert in_place.keys() == out_of_place.keys() == {"fc", "out", "add", "setitem"}
    for key in in_place:
        for a, b in zip(in_place[key], out_of_place[key]):
            assert (a is None) == (b is None) and (a is None or abs(a - b) <= 1e-6 * abs(b)), (key, a, b)


# ------------------------------------------------------------------ operands autograd refuses


class _BatchNormAct(nn.BatchNorm2d):
    """timm's BatchNormAct2d: a BatchNorm whose forward (FX traces it) reads its running statistics as values."""

    def forward(self, x):
        return F.relu(F.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps))


class _NativeBatchNormAct(nn.BatchNorm2d):
    """The same through torch.batch_norm, whose signature puts weight and bias first."""

    def forward(self, x):
        return F.relu(torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var, False, 0.0,
                                       self.eps, False))


@pytest.mark.slow
@pytest.mark.parametrize("norm", [_BatchNormAct, _NativeBatchNormAct])
def test_running_statistics_read_as_values_reach_batch_norm_without_gradient(norm):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), norm(8), nn.Conv2d(8, 4, 1)).eval()
    _, graph, _ = check(model, (torch.rand(1, 3, 16, 16),))  # raised: not differentiable w.r.t. running_mean
    assert graph.capture == "fx"
    assert not any("without gradients" in n for n in texts(graph.notes)), texts(graph.notes)
    bn = next(n for n in graph.nodes if n.fn == "batch_norm")
    assert bn.record(Gains) is not None and bn.record(Gains).out > 0


class _NumpyInTheMiddle(nn.Module):
    """A model that works as users run it (no gradients) and fails with them: .numpy() on a value."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.fc(x)
        scale = float(y.abs().max().numpy())
        return y / scale


def test_a_model_that_fails_with_gradients_is_checked_without_them():
    torch.manual_seed(0)
    report, graph, _ = check(_NumpyInTheMiddle(), (torch.randn(2, 4),))
    assert graph.ran_reference
    assert any("without gradients" in n and "numpy" in n for n in texts(graph.notes)), texts(graph.notes)
    assert graph.nodes[-1].kind == "output"


# ------------------------------------------------------------------ state a model keeps


class _Caches(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.scale = self.fc.weight.sum(0) * 0 + 1  # the user's own tensor with history: left as it is
        self.cache = []

    def forward(self, x):
        if float(x.sum()) > -1e9:  # data-dependent: function mode, as detectors are captured
            self.cache = [torch.linspace(0, 1, 4).to(x.dtype) + 0]  # a constant the model caches (anchors)
        return self.fc(x * self.cache[0]) * self.scale.detach()


def test_the_probe_copies_a_model_that_keeps_tensors_with_history():
    torch.manual_seed(0)
    model = _Caches().eval()
    inputs = (torch.randn(2, 4),)
    _, graph, result = probe(model, inputs)  # raised: only graph leaves support the deepcopy protocol
    assert graph.capture == "function-mode"
    assert result.modes["bf16"].error is None and result.modes["bf16"].output is not None
    assert model.cache[0].grad_fn is None  # what the reference pass left in the model is released
    assert model.scale.grad_fn is not None  # what the user put there is not touched


# ------------------------------------------------------------------ running the traced graph


def _rolled(x, shifts):  # FX keeps it as one call; it changes the list it is given, as swin3d's window code does
    if x.shape[-1] <= shifts[0]:
        shifts[0] = 0
    return x.roll(shifts[0], dims=-1)


torch.fx.wrap("_rolled")


class _ShiftsWindows(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc(_rolled(x, [8]))


def test_the_traced_graph_hands_lists_to_the_code_it_calls_as_lists():
    torch.manual_seed(0)
    _, graph, _ = check(_ShiftsWindows(), (torch.randn(2, 4),))  # raised: 'immutable_list' does not support mutation
    assert graph.capture == "fx" and not texts(graph.notes)


# ------------------------------------------------------------------ function mode: whose op is it


class _Lookup(nn.Module):
    def lookup(self, x):  # a helper method called directly: no forward hooks fire
        return x - x.mean()


class _CallsHelpers(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.corr = _Lookup()

    def forward(self, x):
        if float(x.sum()) > -1e9:
            x = self.fc(x.T.T)
        return self.corr.lookup(x) - x  # the last sub is the root module's own


def test_function_mode_ops_carry_the_module_whose_code_calls_them():
    torch.manual_seed(0)
    _, graph, ctx = check(_CallsHelpers(), (torch.randn(2, 4),))
    subs = [n for n in graph.nodes if n.fn == "sub"]
    assert [(n.module_path, n.module_type) for n in subs] == [("corr", "_Lookup"), ("", "_CallsHelpers")]
    assert ctx.display(subs[1].name) == "Tensor.sub in _CallsHelpers"
    # a property that computes (x.T) is named for what it is, not for its getter (__get__)
    assert [(n.target, n.kind) for n in graph.nodes if n.fn == "t"] == [("Tensor.T", "shape")] * 2
    # the line in the model's code, never a frame outside the model's run (the caller of preclint)
    assert subs[0].location.path == os.path.abspath(__file__)
    assert "return x - x.mean()" in open(__file__).read().splitlines()[subs[0].location.line - 1]


# ------------------------------------------------------------------ detectors


def _box_detector(**kwargs):
    from tests.models.box_detector import BoxDetector

    torch.manual_seed(0)
    return BoxDetector(**kwargs).eval(), ([torch.rand(3, 32, 32)],)


@pytest.mark.slow
def test_a_detector_that_finds_nothing_is_checked_and_probed():
    model, inputs = _box_detector(score_thresh=1.1)  # no score passes: empty boxes, top-k of 0, NMS of 0
    report, graph, result = probe(model, inputs)
    changes = result.modes["bf16"].detections
    assert (changes.reference, changes.measured, changes.changed) == (0, 0, 0)
    assert report.summary["bf16"]["measured_output"]["detections"]["reference"] == 0


@pytest.mark.slow
def test_the_probe_matches_detections_and_judges_decisions_by_them():
    model, inputs = _box_detector()
    report, graph, result = probe(model, inputs, modes=("fp16", "bf16"))
    for mode in ("fp16", "bf16"):
        changes = result.modes[mode].detections
        assert changes.reference > 10 and changes.sets == 1
        assert changes.kept + changes.moved + changes.relabelled + changes.lost == changes.reference
        assert changes.kept + changes.moved + changes.relabelled + changes.added == changes.measured
        assert changes.box_max_abs_error is not None and changes.score_max_abs_error is not None
        assert result.modes[mode].output is not None  # matched boxes and scores, not rows by position
    doc = to_dict(report)
    assert doc["summary"]["bf16"]["measured_output"]["detections"]["kept"] == result.modes["bf16"].detections.kept
    assert any("detections against the float64 reference" in n for n in doc["notes"])
    decisions = [f for f in report.findings if f.code == "PCL301"]
    # a verdict on each, except where no decision flipped and none flipping was the likelier run
    # under the predicted rate (verdict._no_flips): that run says nothing either way
    assert decisions and any(f.status == "confirmed" for f in decisions)
    for f in decisions:
        assert f.status in ("confirmed", "refuted") or all(m.flip_fraction == 0 for m in f.measured.values())
    assert all(m.flip_fraction is not None for f in decisions for m in f.measured.values())
    # the NMS is judged by the boxes it kept, not by their indices among candidates that top-k reordered
    (nms,) = [n.name for n in graph.nodes if n.fn == "nms"]
    for mode in ("fp16", "bf16"):
        assert result.modes[mode].nodes[nms].flip_fraction <= 0.2, mode
    # and predicted from the score gaps of boxes that overlap: an order swap of two boxes apart from
    # each other keeps the same boxes (the gaps of all scores once predicted 27% under fp16, which kept
    # every box)
    assert not any(f.op == "torch.nms" and "fp16" in f.precisions for f in decisions)


@pytest.mark.slow
def test_a_torchvision_detector_is_probed():
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_320_fpn(
        weights=None, weights_backbone=None, min_size=128, max_size=128, box_score_thresh=0.0,
        box_detections_per_img=20).eval()
    report, graph, result = probe(model, ([torch.rand(3, 128, 128)],))
    assert graph.capture == "function-mode"
    measure = result.modes["bf16"]
    assert measure.error is None, measure.error
    assert measure.detections.reference == 20 and measure.detections.measured == 20


# ------------------------------------------------------------------ the float64 reference


class _MakesFloat32(nn.Module):
    """Builds float32 values of its own (a sampling grid, a cast before a layer), as RAFT does."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)

    def forward(self, x):
        h, w = x.shape[-2:]
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, h), torch.linspace(-1, 1, w), indexing="ij")
        grid = torch.stack([xs, ys], dim=-1)[None].float()
        y = F.grid_sample(x, grid * 0.9, align_corners=True)
        return self.conv(y.float())


class _Float32Only(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("float32 inputs only")
        return self.fc(x)


@pytest.mark.slow
def test_a_model_that_makes_float32_values_is_measured_against_float64():
    torch.manual_seed(0)
    _, _, result = probe(_MakesFloat32().eval(), (torch.rand(1, 2, 8, 8),))  # raised: Double but found Float
    assert result.environment["reference"]["dtype"] == "float64"
    assert result.modes["bf16"].error is None and result.modes["bf16"].output.rel_error > 0


def test_a_model_that_refuses_float64_is_measured_against_float32():
    torch.manual_seed(0)
    report, _, result = probe(_Float32Only().eval(), (torch.randn(2, 4),))
    assert result.environment["reference"]["dtype"] == "float32"
    assert any("reference ran in float32" in n for n in texts(report.notes))
    assert result.modes["bf16"].output.rel_error > 1e-4  # bfloat16's error, far above float32's
