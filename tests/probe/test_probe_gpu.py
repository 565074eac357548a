"""The probe on a real GPU: native TF32/float16/bfloat16 against the CPU-style emulation, the
observed run against the plain model, and the reference's record. Skipped without CUDA (CI has
none); run on the GPU machine, where benchmarks/README.md records the figures."""
import pytest
import torch
from torch import nn

from preclint.core.numerics import C_INPUT
from preclint.predict.accumulation import terms_rms
from preclint.probe import ProbeOptions, measure_model
from tests.helpers import check

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

MODES = ("tf32", "fp16", "bf16", "fp16-full", "bf16-full")


def convnet():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1, groups=64), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 100),
    ).eval()
    return model, (torch.rand(8, 3, 32, 32),)


@pytest.fixture(scope="module")
def probed():
    model, inputs = convnet()
    _report, graph, _ctx = check(model, inputs, precisions=MODES)
    native = measure_model(model, inputs, graph, MODES, ProbeOptions(device="cuda"))
    emulated = measure_model(model, inputs, graph, MODES, ProbeOptions(device="cpu"))
    return graph, native, emulated


def test_reference_record_names_the_gpu_and_its_software(probed):
    _graph, native, _ = probed
    env = native.environment
    assert env["emulated"] is False and env["device"].startswith("cuda")
    assert env["gpu"] and env["cuda"] and env["cudnn"]
    assert env["reference"]["dtype"] == "float64" and env["reference"]["tf32"] is False
    assert env["modes"]["fp16"].startswith("torch.autocast('cuda'")
    assert "bfloat16 autocast" in env["contributions"]  # a traced graph: bfloat16 gradients


def test_the_observed_run_is_the_plain_model(probed):
    # observing never alters kernels: the interpreted, observed run gives the plain model's bits
    _graph, native, _ = probed
    for mode, measure in native.modes.items():
        assert measure.error is None, (mode, measure.error)
        assert measure.observer_delta == 0.0, (mode, measure.observer_delta)


def test_native_and_emulated_output_errors_agree_within_2x(probed):
    _graph, native, emulated = probed
    for mode in MODES:
        a, b = native.modes[mode].output.rel_error, emulated.modes[mode].output.rel_error
        assert 0.5 <= b / a <= 2.0, (mode, a, b)


def test_tf32_is_measured_per_layer(probed):
    # every conv and linear gets a verdict, and the verdict separates two sizes of error that sit far
    # apart: TF32's (about C_INPUT * 2^-11 times the summed terms) and float32's (2^-24 scale). cuDNN
    # picks kernels by shape, so which layers use TF32 is what the probe reports, not what this asserts.
    graph, native, _ = probed
    for node in graph.nodes:
        if node.kind not in ("conv", "linear") or not terms_rms(node):
            continue
        m = native.modes["tf32"].nodes[node.name]
        assert m.tf32_applied is not None, node.name
        size = m.local.rel_error * node.out.rms / (C_INPUT * terms_rms(node))
        assert size > 2.0 ** -14 if m.tf32_applied else size < 2.0 ** -20, (node.name, size)


def test_check_probe_cuda_end_to_end(capsys, tmp_path):
    import json

    from preclint.cli import main

    path = tmp_path / "net.py"
    path.write_text(
        "import torch\n"
        "from torch import nn\n\n"
        "model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 8)).eval()\n"
        "example_inputs = (torch.randn(16, 64),)\n"
    )
    code = main(["probe", str(path), "--device", "cuda", "--output-format", "json", "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    doc = json.loads(out)
    assert doc["environment"]["gpu"]
    assert all("local" in row["modes"]["fp16"] for row in doc["nodes"])
