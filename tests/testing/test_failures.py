"""preclint.testing.failures and .recording, which pytest --preclint runs: the precision a model's
settings mean, the model a compared tensor came from (and when there is none to name), and the
comparison a failure came from."""
from __future__ import annotations

import pytest
import torch
import torch.nn.modules.module as module_hooks
from torch import nn

import preclint.testing
from preclint.testing.failures import comparison_of, infer_precision, subject_of
from preclint.testing.recording import Recorder, Settings

CONV = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
LINEAR = nn.Sequential(nn.Linear(4, 4), nn.ReLU())


@pytest.mark.parametrize("settings, model, precision", [
    (Settings("cuda", conv_tf32=True), CONV, "tf32"),  # cuDNN's default: TF32 convolutions
    (Settings("cuda", conv_tf32=True), LINEAR, "fp32"),  # no convolution for that flag to reach
    (Settings("cuda", matmul_tf32=True), LINEAR, "tf32"),
    (Settings("cpu", conv_tf32=True, matmul_tf32=True), CONV, "fp32"),  # the CPU has no TF32
    (Settings("cuda", {"cuda": "float16"}, conv_tf32=True), CONV, "fp16"),
    (Settings("cpu", {"cpu": "bfloat16"}), LINEAR, "bf16"),
    (Settings("cuda", {"cpu": "bfloat16"}), LINEAR, "fp32"),  # autocast on for another device
    (Settings("cuda", dtype="bfloat16"), LINEAR, "bf16-full"),
    (Settings("cuda", conv_tf32=True, matmul_tf32=True, tf32_capable=False), CONV, "fp32"),  # a V100: no TF32
])
def test_the_precision_is_inferred_from_the_settings_the_model_ran_under(settings, model, precision):
    assert infer_precision(settings, model)[0] == precision


@pytest.mark.slow  # the first output_under imports the pipeline
def test_the_recorder_keeps_top_level_calls_and_undoes_itself():
    x = torch.rand(2, 4)
    hooks = (dict(module_hooks._global_forward_hooks), dict(module_hooks._global_forward_pre_hooks))
    with Recorder() as recorder:
        out = LINEAR(x)
        emulated = preclint.testing.output_under(LINEAR, x, "tf32")  # noted; its copy's calls are preclint's
    assert [call.module for call in recorder.calls] == [LINEAR, LINEAR]
    assert recorder.calls[0].output is out and recorder.calls[0].inputs.args[0] is x
    assert recorder.calls[1].output is emulated and recorder.calls[1].precision == "tf32"
    assert type(torch.allclose).__name__ == "builtin_function_or_method" and "allclose" not in torch.Tensor.__dict__
    assert (dict(module_hooks._global_forward_hooks), dict(module_hooks._global_forward_pre_hooks)) == hooks
    assert Recorder.active is None


def failure(check):
    try:
        check()
    except AssertionError as error:
        return error
    raise AssertionError("no failure")


def test_an_allclose_is_the_failed_comparison_only_in_the_statement_that_failed():
    a, b = torch.zeros(3), torch.ones(3)
    with Recorder() as recorder:
        def unrelated():
            close = torch.allclose(a, b)  # noqa: F841
            assert 1 == 2

        def failed():
            assert torch.allclose(
                a, b, atol=0.5)

        found = comparison_of(failure(unrelated), recorder)
        assert found is None
        found = comparison_of(failure(failed), recorder)
    assert found.how == "torch.allclose" and found.actual is a and found.expected is b and found.atol == 0.5


def test_torch_assert_close_is_read_from_the_traceback_however_it_was_imported():
    import functools

    compare = functools.partial(torch.testing.assert_close, rtol=0, atol=0)  # torchvision's assert_equal
    a, b = torch.zeros(3), torch.ones(3)
    with Recorder() as recorder:
        found = comparison_of(failure(lambda: compare(a, b)), recorder)
    assert (found.how, found.actual, found.expected, found.rtol, found.atol) == ("torch.testing.assert_close", a, b, 0, 0)


def test_the_model_is_the_module_that_returned_the_compared_tensor_or_none():
    torch.manual_seed(0)
    first = nn.Linear(4, 4)
    twin = nn.Linear(4, 4)
    twin.load_state_dict(first.state_dict())
    x = torch.rand(2, 4)
    with Recorder() as recorder:
        out = first(x)
    subject, _ = subject_of(out.cpu() * 1, [], list(recorder.calls))  # the same values, not the same tensor
    assert subject.model is first and subject.inputs.args[0] is x
    with Recorder() as recorder:
        first(x)
        twin(x)
    subject, why = subject_of(out, [], list(recorder.calls))
    assert subject is None and "2 modules called in the test returned the compared tensor" in why
    subject, _ = subject_of(out, [(twin, None, "bf16")], list(recorder.calls))  # named: it wins, with its call's inputs
    assert subject.model is twin and subject.inputs.args[0] is x and subject.precision == "bf16"
    subject, why = subject_of(out.softmax(1), [], list(recorder.calls))
    assert subject is None and "preclint_model" in why
