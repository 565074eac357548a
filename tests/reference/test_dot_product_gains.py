"""A dot product passes the error that arrives in its activations on as its weights weigh it
(``Gains.by_input``, from ``input_gains(..., spread=False)``): a head whose weights cancel its terms
amplifies that error, one that averages them damps it. The figures below are apportioned op by op, as
for a model with more outputs than get a backward pass of their own. The cancelling head makes 128
outputs of 8 activations, the averaging one 8: counted per output element, as a broadcast operand is
(spread), the cancelling head's gain was a sixteenth of what it is, and with the outputs' errors
scaled to make the whole output's, the averaging head was predicted 3.3x (float16) over its error."""
import pytest
import torch
from torch import nn

import preclint
from preclint.reference.analyses import output_gains

WIDTH, OUT = 8, 128


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(16, WIDTH)
        self.cancel = nn.Linear(WIDTH, OUT, bias=False)
        self.average = nn.Linear(WIDTH, WIDTH, bias=False)
        with torch.no_grad():
            self.pre.weight.copy_(0.025 * torch.randn(WIDTH, 16))
            self.pre.bias.fill_(20.0)
            # activations near 10.5: each cancelling row adds four and subtracts four (a result of a few
            # units from terms of 10, the rounding of the activations amplified), each averaging
            # row takes their mean (their independent roundings averaged away)
            signs = torch.tensor([1.0] * (WIDTH // 2) + [-1.0] * (WIDTH // 2))
            self.cancel.weight.copy_(torch.stack([signs[torch.randperm(WIDTH)] for _ in range(OUT)]))
            self.average.weight.copy_(torch.full((WIDTH, WIDTH), 1.0 / WIDTH) + 0.01 * torch.randn(WIDTH, WIDTH))

    def forward(self, x):
        # rounded near 20, the linear's result carries to exp's an error several times a rounding of it
        a = torch.exp(self.pre(x) - 17.65)
        return self.cancel(a), self.average(a)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fp16", "bf16"])
def test_a_head_that_cancels_its_terms_amplifies_its_inputs_error_and_one_that_averages_damps_it(monkeypatch, mode):
    monkeypatch.setattr(output_gains, "MAX_OUTPUT_PASSES", 1)  # no output gets a pass of its own
    torch.manual_seed(0)
    model = TwoHeads().eval()
    report = preclint.check(model, torch.randn(32, 16), precisions=(mode,), probe="cpu")
    entry = report.to_dict()["summary"][mode]
    (cancel, average) = [o["rel_error"] for o in entry["outputs"]]
    (cancel_m, average_m) = [o["rel_error"] for o in entry["measured_output"]["outputs"]]
    # what the heads do to the activations' error: the one amplifies it 25-35x more than the other
    assert cancel_m > 10 * average_m
    assert 0.5 < (cancel / average) / (cancel_m / average_m) < 2
    for predicted, measured in ((cancel, cancel_m), (average, average_m)):
        assert measured / 3 < predicted < measured * 3, (predicted, measured)
