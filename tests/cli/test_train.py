"""`preclint check --train`: a training step read from the model's file, its figures in the report."""
import json
import textwrap

import jsonschema
import torch

from preclint.cli import main
from tests.paths import DATA

SCHEMA = json.loads((DATA / "report.schema.json").read_text())

# a regression whose loss gradients are far below float16's subnormals: fp16 autocast without a scaler
REGRESSION = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    example_inputs = (torch.randn(256, 32),)
    example_targets = torch.randn(256, 1) * 1e-3
    def loss_fn(output, target):
        return torch.nn.functional.mse_loss(output, target) * 1e-3
    def make_optimizer(params):
        return torch.optim.SGD(params, lr=1e-2)
"""


def write(tmp_path, source, name="train_model.py"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_report_carries_each_precision_s_predicted_step(tmp_path, capsys):
    code, out, err = run(capsys, "check", write(tmp_path, REGRESSION), "--train", "--precision", "fp16,bf16",
                         "--output-format", "json", "-q")
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    fp16 = document["summary"]["fp16"]["training"]["predicted"]
    bf16 = document["summary"]["bf16"]["training"]["predicted"]
    assert fp16["underflow_fraction"] > 0.05 and bf16["underflow_fraction"] == 0.0
    assert {row["parameter"] for row in fp16["parameters"]} == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert fp16["loss_scale"] == 1.0 and fp16["scale_window"][0] > 1
    assert [layer["module"] for layer in fp16["layers"]] == ["0", "2"]
    first = fp16["layers"][0]
    assert first["numel"] == 32 * 64 + 64 and 0 < first["underflow_fraction"] < 1


def test_a_missing_optimizer_is_one_line_and_exit_2(tmp_path, capsys):
    source = REGRESSION.replace("def make_optimizer(params):", "def other(params):")
    code, out, err = run(capsys, "check", write(tmp_path, source), "--train", "-q")
    assert code == 2
    assert "make_optimizer(params)" in err and len(err.strip().splitlines()) == 1


def test_a_loss_without_targets_is_one_line_and_exit_2(tmp_path, capsys):
    source = REGRESSION.replace("example_targets =", "targets =")
    code, out, err = run(capsys, "check", write(tmp_path, source), "--train", "-q")
    assert code == 2 and "example_targets" in err and len(err.strip().splitlines()) == 1


def test_a_model_that_returns_no_loss_and_no_loss_fn_is_one_line(tmp_path, capsys):
    source = REGRESSION.replace("def loss_fn(output, target):", "def other_fn(output, target):")
    code, out, err = run(capsys, "check", write(tmp_path, source), "--train", "--precision", "fp16", "-q")
    assert code == 2 and "loss_fn" in err and len(err.strip().splitlines()) == 1


def test_the_user_s_model_is_not_stepped(tmp_path):
    import preclint

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))
    before = [p.detach().clone() for p in model.parameters()]
    step = preclint.training_step(loss_fn=torch.nn.functional.mse_loss, targets=torch.randn(4, 1),
                                  make_optimizer=lambda params: torch.optim.SGD(params, lr=1.0))
    preclint.check(model, (torch.randn(4, 8),), precisions=("bf16",), train=step)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(p.grad is None for p in model.parameters())


def test_the_probe_measures_each_precision_s_step_beside_the_prediction(tmp_path, capsys):
    code, out, err = run(capsys, "check", write(tmp_path, REGRESSION), "--train", "--precision", "fp16,bf16",
                         "--probe", "cpu", "--output-format", "json", "-q")
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    for mode in ("fp16", "bf16"):
        predicted = document["summary"][mode]["training"]["predicted"]
        measured = document["summary"][mode]["training"]["measured"]
        for key in ("underflow_fraction", "lost_update_fraction"):
            assert (predicted[key] < 0.01 and measured[key] < 0.01) or \
                measured[key] / 3 <= predicted[key] <= measured[key] * 3, (mode, key)
        assert len(measured["parameters"]) == 4
    (flushing,) = [f for f in document["findings"] if f["code"] == "PCL601"]
    assert flushing["status"] == "confirmed" and flushing["precisions"] == ["fp16"]


def test_the_console_shows_a_training_section(tmp_path, capsys):
    code, out, err = run(capsys, "check", write(tmp_path, REGRESSION), "--train", "--precision", "fp16", "-q",
                         "--color", "never")
    assert "Training step against float64 (predicted)" in out and "0.weight" in out


HF_CLASSIFIER = """
    import torch
    from transformers import BertConfig, BertForSequenceClassification
    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    example_inputs = {"input_ids": torch.randint(0, 100, (4, 16)), "labels": torch.randint(0, 3, (4,))}
    def make_optimizer(params):
        return torch.optim.AdamW(params, lr=1e-3)
"""


def test_a_model_that_returns_its_loss_needs_no_loss_fn(tmp_path, capsys):
    code, out, err = run(capsys, "check", write(tmp_path, HF_CLASSIFIER), "--train", "--precision", "bf16-full",
                         "--output-format", "json", "-q")
    predicted = json.loads(out)["summary"]["bf16-full"]["training"]["predicted"]
    assert predicted["lost_update_fraction"] > 0.1  # AdamW at lr 1e-3 on bfloat16 weights near 1 (the norms)
    assert any(row["parameter"].startswith("bert.embeddings") for row in predicted["parameters"])


def test_the_optimizer_may_come_from_configure_optimizers(tmp_path, capsys):
    source = REGRESSION.replace("def make_optimizer(params):\n        return torch.optim.SGD(params, lr=1e-2)", "") + """
    class Net(torch.nn.Sequential):
        def configure_optimizers(self):
            return {"optimizer": torch.optim.SGD(self.parameters(), lr=1e-4)}
    model = Net(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).bfloat16()
    example_inputs = (torch.randn(256, 32).bfloat16(),)
"""
    code, out, err = run(capsys, "check", write(tmp_path, source), "--train", "--output-format", "json", "-q")
    document = json.loads(out)
    assert list(document["summary"]) and document["summary"]["bf16-full"]["training"]["predicted"]["lost_update_fraction"] > 0.5
    assert "PCL602" in {f["code"] for f in document["findings"]}


HALF_ADAM = """
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).half()
    example_inputs = (torch.randn(256, 32).half(),)
    example_targets = torch.randn(256, 1)
    def loss_fn(output, target):
        return torch.nn.functional.mse_loss(output.float(), target.float())
    def make_optimizer(params):
        return torch.optim.Adam(params, lr=1e-3)
"""


def test_steps_say_where_a_precision_s_loss_parts_from_float32_s(tmp_path, capsys):
    code, out, err = run(capsys, "check", write(tmp_path, HALF_ADAM), "--train", "--probe", "cpu", "--steps", "4",
                         "--output-format", "json", "-q")
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    path = document["summary"]["fp16-full"]["training"]["trajectory"]
    assert path["steps"] == 4 and len(path["loss"]) == 4
    assert path["parts_at"] == 2  # the first update makes weights NaN: the second step's loss is NaN
    assert path["loss"][1] is None and path["loss_float32"][1] is not None


def test_steps_need_the_probe(tmp_path, capsys):
    code, out, err = run(capsys, "check", write(tmp_path, REGRESSION), "--train", "--steps", "3", "-q")
    assert code == 2 and "--probe" in err and len(err.strip().splitlines()) == 1


CLASSIFIER = """
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 128))
example_inputs = (torch.randn(128, 32),)
example_targets = torch.randint(0, 128, (128,))


def loss_fn(output, target):
    return F.cross_entropy(output * 100, target)


def make_optimizer(params):
    return torch.optim.AdamW(params, lr=1e-3)
"""


def test_an_fp8_step_reports_its_scale_statistics_predicted_and_measured(tmp_path, capsys):
    path = write(tmp_path, CLASSIFIER)
    code, out, err = run(capsys, "check", path, "--train", "--precision", "fp8", "--probe", "cpu",
                         "--output-format", "json", "-q", "--exit-zero")
    document = json.loads(out)
    jsonschema.validate(document, SCHEMA)
    training = document["summary"]["fp8"]["training"]
    head = {kind: training[kind]["scaled"]["2"]["grad_output"] for kind in ("predicted", "measured")}
    assert head["measured"]["element"] == "e5m2" and head["measured"]["underflow_fraction"] > 0.5
    assert head["measured"]["underflow_fraction"] / 3 <= head["predicted"]["underflow_fraction"] <= \
        head["measured"]["underflow_fraction"] * 3
    (flushing,) = [f for f in document["findings"] if f["code"] == "PCL605"]
    assert flushing["status"] == "confirmed" and flushing["module"] == "2"
    code, out, err = run(capsys, "check", path, "--train", "--precision", "fp8", "-q", "--color", "never", "--exit-zero")
    assert "Scaled GEMMs in the step" in out and "E5M2" in out
