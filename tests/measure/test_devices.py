"""Float32 on two devices (measure/devices.py), and the fp32 mode's runner: float32 as it is, TF32 off."""
import pytest
import torch

from preclint.core.errors import UserError
from preclint.measure.devices import across_devices, compare_outputs, float32_output, reference_device
from preclint.measure.runners import NativeRunner, runner_for


def _conv_net():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 64, 3, padding=1), torch.nn.ReLU(),
                                torch.nn.Conv2d(64, 64, 3, padding=1)).eval()
    return model, (torch.randn(1, 16, 24, 24),)


def test_the_same_device_compares_its_other_kernels_and_each_run_against_float64():
    model, inputs = _conv_net()
    cpu = torch.device("cpu")
    cross = across_devices(model, inputs, cpu, cpu)
    assert "without oneDNN" in cross.kernels
    # two float32 runs that add in other orders differ by float32's own error, as each does from float64
    assert 0 < cross.between.figure.rel_error < 1e-5
    assert 0 < cross.device_vs_float64.figure.rel_error < 1e-5 and 0 < cross.reference_vs_float64.figure.rel_error < 1e-5
    assert set(cross.as_dict()) == {"device", "reference_device", "kernels", "between", "device_vs_float64",
                                    "reference_vs_float64"}


def test_integer_outputs_and_detections_count_as_decisions():
    scores = torch.tensor([[0.5, 0.2], [0.1, 0.9]])
    same = compare_outputs({"labels": scores.argmax(-1)}, {"labels": scores.argmax(-1)})
    assert same.figure.flip_fraction == 0 and same.decisions == 2 and same.figure.rel_error is None
    flipped = compare_outputs(torch.tensor([1, 1]), torch.tensor([0, 1]))
    assert flipped.figure.flip_fraction == 0.5
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 20.0, 30.0, 30.0]])
    run = [{"boxes": boxes[:1], "scores": torch.tensor([0.9]), "labels": torch.tensor([1])}]
    ref = [{"boxes": boxes, "scores": torch.tensor([0.9, 0.8]), "labels": torch.tensor([1, 1])}]
    detections = compare_outputs(run, ref)
    assert detections.detections.lost == 1 and detections.figure.flip_fraction == 0.5
    assert "1 of 2 reference detections kept" in detections.describe()


@pytest.mark.parametrize("choice, message", [("gpu0", "not a device"), ("meta", "cpu or cuda devices")])
def test_a_device_preclint_cannot_compare_on_is_one_clear_error(choice, message):
    with pytest.raises(UserError, match=message):
        reference_device(choice)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_a_gpu_says_so():
    with pytest.raises(UserError, match="sees no CUDA device"):
        reference_device("cuda")


def test_the_fp32_mode_runs_float32_as_it_is_with_tf32_explicitly_off():
    model, inputs = _conv_net()
    runner = runner_for("fp32", "cpu", emulated=True)  # nothing to emulate: float32 is float32 on the CPU
    assert isinstance(runner, NativeRunner) and "TF32 off" in runner.how
    run = runner.prepare(model, inputs)
    assert run.variant is model and not run.emulated
    with run.context():
        matmul = getattr(torch.backends.cuda.matmul, "fp32_precision", None)
        conv = getattr(torch.backends.cudnn.conv, "fp32_precision", None)
        assert (matmul, conv) in (("ieee", "ieee"), (None, None))
        if matmul is None:
            assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    assert torch.equal(runner.output(model, inputs), float32_output(model, inputs, torch.device("cpu")))
