"""An expected-output model test, as torchvision's test/test_models.py writes one, that passes under
TF32 and still catches a real change. Copy it into a test suite and adapt MODELS.

torchvision records each model's output once (float32, on the CPU) and compares later runs with it at
a fixed tolerance (``prec``). On an Ampere or newer GPU, cuDNN convolutions run in TF32 by default:
a random-init resnet101 or fcn_resnet101 then differs from its recording by far more than float32
does, and the test fails although every kernel is correct. Turning TF32 off hides what the GPU
users run; widening ``prec`` by hand hides real changes too. Here the tolerance is the one TF32 can
meet for that model on those inputs (``preclint.testing``), and a failure says whether it is TF32 or a
change, and which layers carry the error.

    pytest examples/test_models_tf32.py                         # the CPU: TF32 emulated
    PRECLINT_EXAMPLE_DEVICE=cuda pytest examples/test_models_tf32.py   # a GPU: TF32 itself

Environment: PRECLINT_EXPECTED_DIR (where expected outputs are recorded; default expected/ beside
this file, written the first time a model runs, as torchvision's EXPECTTEST_ACCEPT=1 writes them),
PRECLINT_EXAMPLE_DEVICE (cpu or cuda; default cuda where there is one), PRECLINT_EXAMPLE_SIZE (the
input's side, default 64: torchvision's tests use 224 and 520, which take minutes on a CPU).
"""
from __future__ import annotations

import functools
import os
import pathlib

import pytest
import torch
import torchvision

import preclint.testing

DEVICE = os.environ.get("PRECLINT_EXAMPLE_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
EXPECTED = pathlib.Path(os.environ.get("PRECLINT_EXPECTED_DIR") or pathlib.Path(__file__).with_name("expected"))
SIZE = int(os.environ.get("PRECLINT_EXAMPLE_SIZE", "64"))
PRECISION = "tf32"  # what cuDNN runs float32 convolutions in on Ampere and newer, by default

# name -> (builder, keyword arguments, the output compared): torchvision's own test cases, small
MODELS = {
    "resnet18": (torchvision.models.resnet18, {"num_classes": 50}, None),
    "fcn_resnet50": (torchvision.models.segmentation.fcn_resnet50, {"num_classes": 21, "weights_backbone": None}, "out"),
}


def build(name: str):
    """The model (random init, seeded as torchvision's tests seed it) and its input."""
    builder, kwargs, _ = MODELS[name]
    torch.manual_seed(0)
    model = builder(**kwargs).eval()
    x = torch.rand(1, 3, SIZE, SIZE)
    return model, x


def expected_output(name: str, model, x) -> torch.Tensor:
    """The output recorded for ``name`` (float32 on the CPU); recorded now where there is none."""
    path = EXPECTED / f"{name}_{SIZE}.pt"
    if path.exists():
        return torch.load(path, weights_only=True)
    with torch.no_grad():
        out = select(name, model(x))
    EXPECTED.mkdir(parents=True, exist_ok=True)
    torch.save(out, path)
    return out


def select(name: str, output):
    key = MODELS[name][2]
    return output[key] if key is not None else output


def run(name: str, model, x):
    """The output as the test device computes it under TF32: on a GPU with TF32 on, on the CPU with
    TF32 emulated (the CPU has no TF32)."""
    return select(name, preclint.testing.output_under(model, x, PRECISION, device=DEVICE)).cpu()


@functools.lru_cache(maxsize=None)
def tolerance(name: str):
    """The tolerance TF32 can meet for the model's outputs (predicted; probe="cpu" or "cuda" measures
    it), computed once per model for the tests that compare it."""
    model, x = build(name)
    return preclint.testing.tolerance(model, x, PRECISION)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_expected_output_under_tf32(name):
    model, x = build(name)
    expected = expected_output(name, model, x)
    actual = run(name, model, x)
    preclint.testing.assert_close(actual, expected, model=model, inputs=x, precision=PRECISION,
                                  tolerance=tolerance(name))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_weight_perturbed_by_one_percent_is_caught(name):
    model, x = build(name)
    expected = expected_output(name, model, x)
    changed, _ = build(name)
    with torch.no_grad():
        dict(changed.named_parameters())[first_conv(changed)].mul_(1.01)  # one weight, 1% off
    with pytest.raises(AssertionError, match="a real change"):
        preclint.testing.assert_close(run(name, changed, x), expected, model=model, inputs=x, precision=PRECISION,
                                      tolerance=tolerance(name))


def first_conv(model) -> str:
    """The name of the weight of the model's first convolution (its stem)."""
    return next(f"{name}.weight" for name, m in model.named_modules() if isinstance(m, torch.nn.Conv2d))
