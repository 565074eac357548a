"""`preclint check --train` of a PyTorch Lightning module: the loss is its training_step on an example batch
(the file's example_batch, a datamodule's or the module's own train_dataloader), the optimizer what
configure_optimizers returns in any of Lightning's forms, with its parameter groups."""
import json
import textwrap

import pytest
import torch

from preclint.core.errors import UserError
from preclint.load.lightning_step import configured_optimizer
from tests.cli.test_train import REGRESSION, run, write

LIGHTNING_REGRESSION = """
    import torch
    import lightning as L

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self(x), y) * 1e-3
            self.log("train_loss", loss)
            return {"loss": loss}

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1e-2)
            return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 10)}

    torch.manual_seed(0)
    model = Regression()
    x, y = torch.randn(256, 32), torch.randn(256, 1) * 1e-3
    model.example_input_array = x[:4]  # Lightning's own name for the forward's example inputs
"""


def summary(capsys, path, *flags):
    code, out, err = run(capsys, "check", path, "--train", "--output-format", "json", "-q", *flags)
    assert code in (0, 1), err
    return json.loads(out)


@pytest.mark.slow  # importing lightning takes seconds
def predicted(document, mode):
    return document["summary"][mode]["training"]["predicted"]


def test_a_lightning_module_s_step_predicts_what_the_same_plain_step_does(tmp_path, capsys):
    """The batch from the module's train_dataloader, the loss from training_step: the same figures as
    tests/cli/test_train.py's regression (the same weights, data, loss and SGD) given by loss_fn; fp16 with
    the GradScaler Lightning's "16-mixed" always has, bf16 without one."""
    pytest.importorskip("lightning")
    source = LIGHTNING_REGRESSION.replace("        def configure_optimizers", """        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=256)

        def configure_optimizers""")
    lightning = summary(capsys, write(tmp_path, source, "lit.py"), "--precision", "fp16,bf16")
    plain = summary(capsys, write(tmp_path, REGRESSION, "plain.py"), "--precision", "fp16,bf16")
    scaled = summary(capsys, write(tmp_path, REGRESSION + '    scaler = torch.amp.GradScaler("cpu")\n', "scaled.py"),
                     "--precision", "fp16")
    for ours, theirs in ((predicted(lightning, "fp16"), predicted(scaled, "fp16")),
                         (predicted(lightning, "bf16"), predicted(plain, "bf16"))):
        assert ours["underflow_fraction"] == pytest.approx(theirs["underflow_fraction"])
        assert ours["lost_update_fraction"] == pytest.approx(theirs["lost_update_fraction"])
        assert ours["loss_scale"] == theirs["loss_scale"]
    assert predicted(lightning, "fp16")["loss_scale"] == 65536 and predicted(lightning, "bf16")["loss_scale"] == 1
    assert predicted(lightning, "fp16")["underflow_fraction"] < 0.01 < predicted(plain, "fp16")["underflow_fraction"]
    assert {row["parameter"] for row in predicted(lightning, "fp16")["parameters"]} == {
        "net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert "PCL601" not in {f["code"] for f in lightning["findings"]}
    assert any('precision="16-mixed"' in note for note in lightning["notes"])
    assert any("configure_optimizers()" in note for note in lightning["notes"])  # the scheduler's lr is the first step's


def test_a_disabled_scaler_is_fp16_autocast_without_scaling(tmp_path, capsys):
    """MixedPrecision("16-mixed", scaler=GradScaler(enabled=False)): the flushes of the unscaled step."""
    pytest.importorskip("lightning")
    source = LIGHTNING_REGRESSION + """    example_batch = (x, y)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
"""
    lightning = summary(capsys, write(tmp_path, source, "lit.py"), "--precision", "fp16")
    plain = summary(capsys, write(tmp_path, REGRESSION, "plain.py"), "--precision", "fp16")
    assert predicted(lightning, "fp16")["underflow_fraction"] == pytest.approx(predicted(plain, "fp16")["underflow_fraction"])
    assert predicted(lightning, "fp16")["underflow_fraction"] > 0.05
    assert "PCL601" in {f["code"] for f in lightning["findings"]}


@pytest.mark.slow  # importing lightning takes seconds
def test_pure_float16_adam_from_configure_optimizers_is_flagged(tmp_path, capsys):
    """A model in float16 (Lightning's precision="16-true") with Adam's eps=1e-8: eps rounds to 0, weights
    whose second moment stores 0 become NaN; the optimizer comes as ([optimizers], [schedulers])."""
    pytest.importorskip("lightning")
    source = LIGHTNING_REGRESSION.replace(
        'return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.StepLR(optimizer, 10)}',
        "return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 10)]").replace(
        "torch.optim.SGD(self.parameters(), lr=1e-2)", "torch.optim.Adam(self.parameters(), lr=1e-3)").replace(
        "self(x), y)", "self(x).float(), y.float())") + """
    model = model.half()
    example_batch = (x.half(), y)
"""
    document = summary(capsys, write(tmp_path, source))
    predicted = document["summary"]["fp16-full"]["training"]["predicted"]
    assert predicted["nonfinite_updates"] > 1000 and any("eps=1e-08 rounds to 0" in h for h in predicted["hazards"])
    assert {"PCL603", "PCL604"} <= {f["code"] for f in document["findings"]}


@pytest.mark.slow  # importing lightning takes seconds
def test_the_batch_may_come_from_a_datamodule(tmp_path, capsys):
    pytest.importorskip("lightning")
    source = LIGHTNING_REGRESSION + """
    class Data(L.LightningDataModule):
        def setup(self, stage):
            self.train = torch.utils.data.TensorDataset(x, y)
        def train_dataloader(self):
            return torch.utils.data.DataLoader(self.train, batch_size=256)
    datamodule = Data()
"""
    ours = predicted(summary(capsys, write(tmp_path, source, "dm.py"), "--precision", "fp16-full"), "fp16-full")
    given = predicted(summary(capsys, write(tmp_path, LIGHTNING_REGRESSION + "    example_batch = (x, y)\n", "eb.py"),
                              "--precision", "fp16-full"), "fp16-full")
    assert ours["lost_update_fraction"] == given["lost_update_fraction"] > 0.01  # the same batch, (x, y)
    assert ours["underflow_fraction"] == given["underflow_fraction"] > 0.05


@pytest.mark.slow  # importing lightning takes seconds
def test_without_a_batch_or_with_manual_optimization_it_is_one_line_and_exit_2(tmp_path, capsys):
    pytest.importorskip("lightning")
    code, out, err = run(capsys, "check", write(tmp_path, LIGHTNING_REGRESSION), "--train", "-q")
    assert code == 2 and "example_batch = ..." in err and len(err.strip().splitlines()) == 1
    manual = LIGHTNING_REGRESSION.replace("super().__init__()", "super().__init__()\n            "
                                          "self.automatic_optimization = False") + "    example_batch = (x, y)\n"
    code, out, err = run(capsys, "check", write(tmp_path, manual), "--train", "-q")
    assert code == 2 and "automatic_optimization = False" in err and len(err.strip().splitlines()) == 1


# Without Lightning: a module with a training_step and the file's example_batch steps the same way.
DUCK = """
    import torch

    class Regression(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))

        def forward(self, x):
            return self.net(x)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y) * 1e-3

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-2)

    torch.manual_seed(0)
    model = Regression()
    x, y = torch.randn(256, 32), torch.randn(256, 1) * 1e-3
    example_inputs = (x,)
    example_batch = lambda: (x, y)
"""


def test_a_module_with_a_training_step_needs_no_lightning(tmp_path, capsys):
    ours = summary(capsys, write(tmp_path, DUCK, "duck.py"), "--precision", "fp16")
    plain = summary(capsys, write(tmp_path, REGRESSION, "plain.py"), "--precision", "fp16")
    assert ours["summary"]["fp16"]["training"]["predicted"]["underflow_fraction"] == pytest.approx(
        plain["summary"]["fp16"]["training"]["predicted"]["underflow_fraction"])


class _Configured(torch.nn.Module):
    """A module whose configure_optimizers returns ``returned(optimizer, scheduler)``: decayed weights and
    undecayed biases in two groups, as Lightning users often write it."""

    def __init__(self, returned, warmup=False):
        super().__init__()
        self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
        self.returned, self.warmup = returned, warmup

    def configure_optimizers(self):
        weights = [p for n, p in self.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in self.named_parameters() if n.endswith("bias")]
        optimizer = torch.optim.AdamW([{"params": weights, "weight_decay": 0.1},
                                       {"params": biases, "weight_decay": 0.0}], lr=1e-3, eps=1e-6)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 100 if self.warmup else 1.0)
        return self.returned(optimizer, scheduler)


FORMS = {
    "optimizer": lambda o, s: o,
    "list": lambda o, s: [o],
    "dict": lambda o, s: {"optimizer": o, "lr_scheduler": {"scheduler": s, "interval": "step"}},
    "list of dicts": lambda o, s: [{"optimizer": o, "lr_scheduler": s}],
    "tuple of lists": lambda o, s: ([o], [s]),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_form_of_configure_optimizers_rebuilds_the_groups(form):
    module = _Configured(FORMS[form])
    make, notes = configured_optimizer(module, "m.py")
    copies = [torch.nn.Parameter(p.detach().clone()) for p in module.parameters()]
    rebuilt = make(copies)
    assert type(rebuilt) is torch.optim.AdamW and len(rebuilt.param_groups) == 2
    decayed, undecayed = rebuilt.param_groups
    assert [id(p) for p in decayed["params"]] == [id(copies[0]), id(copies[2])] and decayed["weight_decay"] == 0.1
    assert undecayed["weight_decay"] == 0.0 and undecayed["eps"] == 1e-6 and undecayed["lr"] == 1e-3
    assert any("lr=0.001" in note.text for note in notes) == (form not in ("optimizer", "list"))  # a scheduler is said


def test_a_warmup_from_zero_is_checked_at_the_base_learning_rate():
    make, notes = configured_optimizer(_Configured(lambda o, s: ([o], [s]), warmup=True), "m.py")
    assert all(group["lr"] == 1e-3 for group in make(list(_Configured(None).parameters())).param_groups)
    assert "base lr=0.001" in notes[0].text and notes[0].kind == "training"


@pytest.mark.slow  # importing lightning takes seconds
def test_no_optimizer_from_a_lightning_module_is_one_line():
    lightning = pytest.importorskip("lightning")

    class Bare(lightning.LightningModule):
        def configure_optimizers(self):
            return None

    with pytest.raises(UserError, match="returned no optimizer"):
        configured_optimizer(Bare(), "m.py")


def test_from_python_a_built_module_takes_its_batch(tmp_path, capsys):
    """preclint.check(module, inputs, train=preclint.training_step(batch=...)): the optimizer from
    configure_optimizers, the same figures as the file's example_batch gives."""
    import preclint

    namespace: dict = {}
    exec(textwrap.dedent(DUCK), namespace)  # noqa: S102 - the test's own source
    model, x, y = namespace["model"], namespace["x"], namespace["y"]
    report = preclint.check(model, (x,), precisions=("fp16",), train=preclint.training_step(batch=(x, y)))
    from_file = summary(capsys, write(tmp_path, DUCK, "duck.py"), "--precision", "fp16")
    ours, theirs = report.document.summary["fp16"]["training"]["predicted"], predicted(from_file, "fp16")
    assert ours["underflow_fraction"] == pytest.approx(theirs["underflow_fraction"]) and ours["underflow_fraction"] > 0.05
    with pytest.raises(UserError, match="one or the other"):
        preclint.training_step(batch=(x, y), loss_fn=torch.nn.functional.mse_loss, targets=y)
    with pytest.raises(UserError, match="has none"):
        preclint.check(torch.nn.Linear(32, 1), (x,), precisions=("fp16",), train=preclint.training_step(batch=(x, y)))
