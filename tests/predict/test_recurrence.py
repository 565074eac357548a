"""Error that accumulates over the steps of a recurrence: predicted from the recurrence's own gradients
over the sequence (reference/analyses/recurrence.py), and emulated with the states stored in the
format after every step, as the reduced-precision kernels store them (measure/recurrent.py)."""
import copy
import json

import pytest
import torch

from preclint.cli import main
from preclint.measure.recurrent import run_steps
from tests.helpers import check

# a trained sequence model's long memory: forget gates biased open and a strong recurrent weight; its
# last state carries every step's rounding
LONG_MEMORY = """\
import torch
from torch import nn


class Memory(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lstm = nn.LSTM(16, 64, num_layers=2)
        self.head = nn.Linear(64, 8)
        with torch.no_grad():
            for name, p in self.lstm.named_parameters():
                if name.startswith("bias_ih"):
                    p[64:128] = 3.0  # the forget gate
                if name.startswith("weight_hh"):
                    p.mul_(3.0)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return self.head(h[-1])


torch.manual_seed(1)
model = Memory().eval()
example_inputs = (torch.randn(200, 4, 16),)
"""


@pytest.mark.parametrize("cls", [torch.nn.LSTM, torch.nn.GRU, torch.nn.RNN])
@pytest.mark.parametrize("batch_first,bidirectional,batched", [(True, True, True), (False, False, True), (False, True, False)])
def test_stepping_computes_what_the_module_does(cls, batch_first, bidirectional, batched):
    torch.manual_seed(0)
    module = cls(5, 7, num_layers=2, batch_first=batch_first, bidirectional=bidirectional).double()
    x = torch.randn(3, 4, 5, dtype=torch.float64) if batched else torch.randn(4, 5, dtype=torch.float64)
    expected, got = module(x), run_steps(module, x)
    flat = lambda out: [out[0]] + (list(out[1]) if isinstance(out[1], tuple) else [out[1]])  # noqa: E731
    for a, b in zip(flat(expected), flat(got)):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.slow
def test_the_steps_error_is_predicted(tmp_path, capsys):
    # Before: fp16 predicted 0.013 (the LSTM's input and output rounded once) against 0.125 measured.
    path = tmp_path / "memory.py"
    path.write_text(LONG_MEMORY)
    code = main(["check", str(path), "--precision", "fp16", "--probe", "cpu", "--output-format", "json", "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    fp16 = json.loads(out)["summary"]["fp16"]
    predicted, measured = fp16["predicted_output"]["rel_error"], fp16["measured_output"]["rel_error"]
    assert measured > 0.03
    assert measured / 2 <= predicted <= measured * 2


def _long_memory_lstm():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(16, 64, num_layers=2).eval()
    with torch.no_grad():
        for name, p in lstm.named_parameters():
            if name.startswith("bias_ih"):
                p[64:128] = 3.0
    return lstm, (torch.randn(100, 4, 16),)


def _rel(a, reference):
    return float((a.double() - reference.double()).pow(2).mean().sqrt() / reference.double().pow(2).mean().sqrt())


def test_emulated_bfloat16_lstm_follows_the_cpu_kernel():
    # A bfloat16 nn.LSTM on the CPU runs oneDNN's bfloat16 LSTM (mkldnn_rnn_layer), which stores h and c
    # in bfloat16 after every step: 3x the error of rounding at the boundary only
    from preclint.measure.runners import run_mode, run_reference

    lstm, x = _long_memory_lstm()
    reference = run_reference(lstm, x)[0]
    emulated = run_mode(lstm, x, "bf16-full", "cpu", emulated=True)[0]
    try:
        with torch.no_grad():
            native = copy.deepcopy(lstm).to(torch.bfloat16)(x[0].to(torch.bfloat16))[0]
    except RuntimeError:
        pytest.skip("this CPU has no bfloat16 LSTM")
    assert _rel(native, reference) / 1.5 <= _rel(emulated, reference) <= _rel(native, reference) * 1.5


def test_bfloat16_autocast_runs_cudnn_rnns_in_float16():
    # CUDA autocast casts cuDNN's RNNs to float16 whatever its dtype (aten/src/ATen/cudnn/AutocastRNN.cpp):
    # the emulation and the prediction follow it, an order of magnitude below bfloat16's error
    from preclint.measure.runners import run_mode, run_reference

    lstm, x = _long_memory_lstm()
    reference = run_reference(lstm, x)[0]
    bf16, fp16, bf16_full = (_rel(run_mode(lstm, x, mode, "cpu", emulated=True)[0], reference)
                             for mode in ("bf16", "fp16", "bf16-full"))
    assert bf16 == pytest.approx(fp16, rel=1e-6) and bf16_full > 4 * bf16
    report, _graph, _ctx = check(lstm, x, precisions=("fp16", "bf16", "bf16-full"))
    predicted = {mode: report.summary[mode]["predicted_output"]["rel_error"] for mode in ("fp16", "bf16", "bf16-full")}
    assert predicted["bf16"] == pytest.approx(predicted["fp16"], rel=1e-6) and predicted["bf16-full"] > 4 * predicted["bf16"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_emulated_bfloat16_autocast_lstm_follows_cuda():
    from preclint.measure.runners import run_mode, run_reference

    lstm, x = _long_memory_lstm()
    reference = run_reference(lstm, x)[0]
    emulated = run_mode(lstm, x, "bf16", "cpu", emulated=True)[0]
    native = run_mode(lstm.cuda(), tuple(t.cuda() for t in x), "bf16", "cuda", emulated=False)[0].cpu()
    assert _rel(native, reference) / 1.5 <= _rel(emulated, reference) <= _rel(native, reference) * 1.5
