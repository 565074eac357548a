"""TF32's kernel assumption (core/kernels.py): the prediction and the CPU emulation make the same
one, say which, and give both cases where the backend chooses."""
import json

import pytest

from preclint.cli import main

PATCH_EMBEDDING = """\
import torch
torch.manual_seed(0)
model = torch.nn.Conv2d(3, 384, kernel_size=14, stride=14).eval()
example_inputs = (torch.rand(1, 3, 224, 224),)
"""

# a training script's CNN (MNIST-sized): small convs and batch-8 linears, which an H200 ran in float32
SMALL_CNN = """\
import torch
from torch import nn
torch.manual_seed(0)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(1, 32, 3)
        self.c2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x))
        x = torch.max_pool2d(x, 2).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


model = Net().eval()
example_inputs = (torch.rand(8, 1, 28, 28),)
"""


def _json(capsys, *argv):
    code = main(list(argv) + ["--output-format", "json", "--exit-zero"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


@pytest.mark.slow
def test_the_emulation_skips_tf32_where_the_prediction_does(tmp_path, capsys):
    # A bare patch-embedding conv: predicted 0 under TF32 (no TF32 kernel on an H200, which measured
    # 4.5e-7), but the emulation rounded its weight to TF32 and measured 2.3e-4.
    path = tmp_path / "patch.py"
    path.write_text(PATCH_EMBEDDING)
    doc = _json(capsys, "check", str(path), "--precision", "tf32", "--probe", "cpu")
    tf32 = doc["summary"]["tf32"]
    assert tf32["predicted_output"]["rel_error"] == 0
    assert tf32["measured_output"]["rel_error"] < 1e-5  # float32-sized: 4.4e-7 here
    assert any(n.startswith("tf32 assumes") and "1 runs a float32 kernel" in n for n in doc["notes"])


def test_a_small_cnn_gets_both_cases_and_says_which_kernels_it_assumes(tmp_path, capsys):
    path = tmp_path / "train.py"
    path.write_text(SMALL_CNN)
    doc = _json(capsys, "check", str(path), "--precision", "tf32")
    tf32 = doc["summary"]["tf32"]
    headline = tf32["predicted_output"]["rel_error"]
    assert headline > 1e-5  # every kernel that may take TF32 does
    assert tf32["if_float32_kernels"]["rel_error"] < headline / 100  # the backend's choices in float32
    note = next(n for n in doc["notes"] if n.startswith("tf32 assumes"))
    assert "if they use TF32 tensor cores" in note and "if they run in float32" in note and "headline" in note
    code = main(["check", str(path), "--precision", "tf32", "--exit-zero"])
    assert code == 0 and "if float32 kernels" in capsys.readouterr().out


def test_kernel_classes_agree_between_prediction_and_emulation():
    from preclint.core.kernels import BACKEND, FLOAT32, TF32, conv_kernel, product_kernel
    from preclint.measure.modes import conv_uses_tf32, product_uses_tf32

    assert conv_kernel(3, 1, 196, 256, 384) == FLOAT32  # patch embedding
    assert conv_kernel(64, 64 // 64, 9, 3136, 64) == TF32  # resnet's 3x3 convs
    assert conv_kernel(32, 1, 9, 4608, 64) == BACKEND  # a small training-script conv
    assert product_kernel(8, 128, 9216) == BACKEND and product_kernel(1, 1000, 512) == FLOAT32
    assert product_kernel(197, 768, 768) == TF32
    assert not conv_uses_tf32((384, 3, 14, 14), 1, False, 256)
    assert conv_uses_tf32((64, 32, 3, 3), 1, False, 4608)  # the headline's assumption: TF32 where allowed
    assert not product_uses_tf32(1, (1000, 512)) and product_uses_tf32(8, (128, 9216))


# a decode step: one query attends over a cache of 31 keys (scaled_dot_product_attention)
DECODE_ATTENTION = """\
import torch
import torch.nn.functional as F
torch.manual_seed(0)


class Attend(torch.nn.Module):
    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)


model = Attend().eval()
example_inputs = (torch.randn(2, 4, 1, 64), torch.randn(2, 4, 31, 64), torch.randn(2, 4, 31, 64))
"""


def test_one_query_attending_is_a_single_row_product_to_both(tmp_path, capsys):
    # Before: the prediction assumed TF32 for every scaled_dot_product_attention (2.9e-4 in a Llama
    # decode step) while the emulation ran its one query row in float32 and measured 1e-7.
    path = tmp_path / "decode.py"
    path.write_text(DECODE_ATTENTION)
    doc = _json(capsys, "check", str(path), "--precision", "tf32", "--probe", "cpu")
    tf32 = doc["summary"]["tf32"]
    assert tf32["predicted_output"]["rel_error"] == 0
    assert tf32["measured_output"]["rel_error"] < 1e-5
