"""preclint.watch.LightningCallback in a real lightning.Trainer fit on the CPU: it records what preclint.watch
records in a hand-written loop of the same steps, counts the skips of the precision plugin's GradScaler with
their cause, sees the flushes GradScaler cures and the non-finite weights of pure float16 Adam, writes the
JSON lines the HTML report reads, and leaves the optimizer and the scaler as it found them."""
import json
import logging
import warnings

import pytest
import torch

import preclint

L = pytest.importorskip("lightning")
from lightning.pytorch.plugins.precision import MixedPrecision  # noqa: E402

pytestmark = pytest.mark.slow
STEPS = 4


class Regression(L.LightningModule):
    """A regression whose loss gradients are far below float16's subnormals (tests/cli/test_train.py's)."""

    def __init__(self, optimizer="sgd", through_forward=True):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.optimizer, self.through_forward = optimizer, through_forward

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        output = self(x) if self.through_forward else self.net(x)  # the module's own call is not needed
        return torch.nn.functional.mse_loss(output.float(), y.float()) * 1e-3

    def configure_optimizers(self):
        if self.optimizer == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        return torch.optim.SGD(self.parameters(), lr=1e-2)


def batches():
    torch.manual_seed(1)
    x, y = torch.randn(256, 32), torch.randn(256, 1) * 1e-3
    return [(x[i:i + 64], y[i:i + 64]) for i in range(0, 256, 64)]


def fit(module, callback, steps=STEPS, **trainer):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        L.Trainer(max_steps=steps, accelerator="cpu", logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[callback], **trainer
                  ).fit(module, torch.utils.data.DataLoader(batches(), batch_size=None))
    return callback.watch


def fp16_autocast(scaler):
    return [MixedPrecision("16-mixed", "cpu", scaler=scaler)]


def test_the_callback_records_what_the_context_manager_records(tmp_path):
    """fp16 autocast without a GradScaler: the same flushes, step by step, as preclint.watch around a loop."""
    callback = preclint.watch.LightningCallback(every=2, path=str(tmp_path / "fit.jsonl"), summary=False)
    watched = fit(Regression(), callback, plugins=fp16_autocast(torch.amp.GradScaler("cpu", enabled=False)))
    records = [json.loads(line) for line in (tmp_path / "fit.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2] and watched.step == STEPS
    assert all(r["autocast"] == "float16" and r["layers"]["net.2"]["grad_dtype"] == "float16" for r in records)
    assert records[0]["totals"]["underflow_fraction"] > 0.02  # the last layer's GEMM flushes its input's gradient
    preclint.watch_report(tmp_path / "fit.jsonl", tmp_path / "fit.html")
    assert "flushed gradients (GEMMs)" in (tmp_path / "fit.html").read_text()

    module = Regression()
    optimizer = module.configure_optimizers()
    with preclint.watch(module, optimizer, every=2) as plain:
        for x, y in batches()[:STEPS]:
            with torch.autocast("cpu", dtype=torch.float16):
                loss = module.training_step((x, y), 0)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert [r["layers"] for r in plain.records] == [r["layers"] for r in records]
    assert plain.summary()["underflow_fraction"] == watched.summary()["underflow_fraction"]


def test_gradscaler_skips_of_16_mixed_are_counted_with_their_cause():
    callback = preclint.watch.LightningCallback(every=100, summary=False)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    watched = fit(Regression(), callback, plugins=fp16_autocast(scaler))
    summary = watched.summary()
    assert summary["steps"] == STEPS and summary["skipped_steps"] == STEPS  # 2**40 to 2**37 all overflow
    skips = [skip for record in watched.records for skip in record["skips"]]
    assert [skip["scale"] for skip in skips] == [2.0 ** 40, 2.0 ** 39, 2.0 ** 38, 2.0 ** 37]
    assert skips[0]["parameters"][:2] == ["net.2.bias", "net.2.weight"]  # backward reaches the last layer first
    assert watched.records[0]["first_nonfinite_backward"] == "net.2"
    assert "step" not in vars(scaler) and not watched.optimizer._optimizer_step_post_hooks  # put back at the end


def test_lightning_s_default_gradscaler_cures_the_flushes():
    flushing = fit(Regression(through_forward=False), preclint.watch.LightningCallback(every=1, summary=False),
                   plugins=fp16_autocast(torch.amp.GradScaler("cpu", enabled=False))).summary()
    scaled = fit(Regression(through_forward=False), preclint.watch.LightningCallback(every=1, summary=False),
                 plugins=fp16_autocast(None)).summary()  # "16-mixed": GradScaler at 65536
    assert flushing["underflow_fraction"] > 0.02 and scaled["underflow_fraction"] == 0.0
    assert scaled["skipped_steps"] == 0 and scaled["sampled_steps"] == STEPS


def test_pure_float16_adam_makes_weights_nonfinite(capsys):
    module = Regression("adam")
    watched = fit(module, preclint.watch.LightningCallback(every=2), precision="16-true")
    summary = watched.summary()
    first, after = watched.records[0], watched.records[1]
    assert first["totals"]["nonfinite_updates"] == sum(p.numel() for p in module.parameters())  # every weight
    assert summary["first_nonfinite"]["step"] == 0 and summary["first_nonfinite"]["first_nonfinite_update"] == "net.0.weight"
    assert after["step"] == 1 and after["first_nonfinite_forward"] == "net.0"  # sampled after the damage: the cause
    assert "non-finite weights" in capsys.readouterr().err  # the summary, printed when training ends


def test_a_clean_float32_fit_records_no_flush_and_nothing_nonfinite():
    summary = fit(Regression(), preclint.watch.LightningCallback(every=1, summary=False)).summary()
    assert summary["sampled_steps"] == STEPS and summary["underflow_fraction"] is None  # no low-precision GEMM
    assert summary["nonfinite_updates"] == 0 and summary["first_nonfinite"] is None


def test_accumulated_batches_are_one_step_whose_micro_batches_all_count():
    """accumulate_grad_batches=2: a step per two batches, and the sampled step counts both batches' flushes
    (net.2's input gradient is 64 x 64 a batch)."""
    fp16 = fp16_autocast(torch.amp.GradScaler("cpu", enabled=False))
    watched = fit(Regression(), preclint.watch.LightningCallback(every=1, summary=False), accumulate_grad_batches=2,
                  plugins=fp16)
    assert watched.step == STEPS and [r["step"] for r in watched.records] == list(range(STEPS))
    assert all(r["layers"]["net.2"]["gradient_elements"] >= 2 * 64 * 64 for r in watched.records)


def test_under_ddp_the_ranks_records_are_summed(tmp_path):
    """strategy="ddp_spawn" on two CPU processes (gloo): the callback is pickled to each, and rank 0 writes
    records whose counts add both ranks' (each rank's copy of net.0 has 32 x 64 + 64 weights)."""
    path = tmp_path / "ddp.jsonl"
    fit(Regression(), preclint.watch.LightningCallback(every=1, path=str(path), summary=False), steps=2,
        strategy="ddp_spawn", devices=2, plugins=fp16_autocast(torch.amp.GradScaler("cpu", enabled=False)))
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1] and all(r["world_size"] == 2 for r in records)
    assert all(r["layers"]["net.0"]["weights"] == 2 * (32 * 64 + 64) for r in records)
    assert all(r["totals"]["underflow_fraction"] > 0.02 for r in records)


def test_every_must_be_a_whole_number_of_steps():
    with pytest.raises(ValueError, match="every=0"):
        preclint.watch.LightningCallback(every=0)


def test_the_callback_reads_scaled_layers_with_their_recipe():
    """``recipe=`` reaches the monitor: NVFP4 block scales per operand, and a delayed scale drawn from the
    amax of the steps before it (the history is kept across the Trainer's steps)."""
    nvfp4 = fit(Regression(), preclint.watch.LightningCallback(every=1, summary=False, scaled="all", recipe="nvfp4"))
    figures = nvfp4.records[0]["layers"]["net.0"]["scales"]
    assert set(figures) == {"input", "weight", "grad"} and figures["input"]["blocks"] == 64 * 32 // 16
    delayed = fit(Regression(), preclint.watch.LightningCallback(every=1, summary=False, scaled="all",
                                                                 recipe="fp8 amax-history=2"))
    first, second = (r["layers"]["net.0"]["delayed"]["input"] for r in delayed.records[:2])
    assert first["scale"] == 1.0 and second["scale"] == pytest.approx(448 / first["amax"], rel=1e-6)
