"""preclint.watch in a user's own loop: the three cases of issue 40 show up in its JSON lines (flushed
gradients, lost updates, non-finite updates with their producer), a clean run shows none, GradScaler skips
come with their cause, and the monitor leaves the model, the optimizer and the scaler as it found them."""
import json
from collections import OrderedDict

import pytest
import torch

import preclint
from preclint.training.watch import summary_text


def mlp(dtype=torch.float32):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)).to(dtype)
    return model, torch.randn(256, 32).to(dtype), torch.randn(256, 1).to(dtype)


def train(model, optimizer, x, y, steps, autocast=None, loss_weight=1.0, scaler=None, **watch):
    with preclint.watch(model, optimizer, scaler=scaler, **watch) as monitor:
        for _ in range(steps):
            with torch.autocast("cpu", dtype=autocast or torch.float16, enabled=autocast is not None):
                loss = torch.nn.functional.mse_loss(model(x).float(), y.float()) * loss_weight
            optimizer.zero_grad()
            if scaler is None:
                loss.backward()
                optimizer.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
    return monitor


def lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_fp16_autocast_without_a_scaler_flushes_gradients(tmp_path):
    model, x, y = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    train(model, optimizer, x, y * 1e-4, steps=3, autocast=torch.float16, loss_weight=1e-4, every=1,
          path=tmp_path / "run.jsonl")
    records = lines(tmp_path / "run.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[0]["autocast"] == "float16" and records[0]["scale"] is None
    assert records[0]["totals"]["underflow_fraction"] > 0.9
    # the flush is in the backward GEMM of the last layer: its input's gradient, and every layer below it
    assert records[0]["layers"]["4"]["gradient_flushed"] > 0
    assert records[0]["layers"]["4"]["grad_dtype"] == "float16"


@pytest.mark.slow
def test_pure_bf16_sgd_at_a_small_learning_rate_loses_updates(tmp_path):
    model, x, y = mlp(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    monitor = train(model, optimizer, x, y, steps=2, every=1)
    assert monitor.records[0]["totals"]["lost_update_fraction"] > 0.99
    assert all(monitor.records[0]["layers"][path]["lost_update_fraction"] > 0.9 for path in ("0", "2", "4"))
    assert monitor.summary()["lost_update_fraction"] > 0.99


@pytest.mark.slow
def test_half_model_with_adam_names_its_first_nonfinite_update_and_producer():
    model, x, y = mlp(torch.float16)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)  # eps=1e-8 is 0 in float16: 0/0 where v flushes
    monitor = train(model, optimizer, x, y, steps=2, every=1)
    first, second = monitor.records
    assert first["totals"]["nonfinite_updates"] > 1000
    assert first["first_nonfinite_update"] == "0.weight"
    assert first["first_nonfinite_forward"] is None
    assert second["first_nonfinite_forward"] == "0"  # the first layer, now with NaN weights, in forward order
    summary = monitor.summary()
    assert summary["first_nonfinite"]["step"] == 0
    assert "first non-finite at step 0" in summary_text(summary)


def test_a_clean_run_shows_none(tmp_path):
    model, x, y = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    monitor = train(model, optimizer, x, y, steps=4, every=2)
    assert [r["step"] for r in monitor.records] == [0, 2]
    summary = monitor.summary()
    assert summary["nonfinite_updates"] == 0 and summary["first_nonfinite"] is None
    assert summary["underflow_fraction"] is None  # float32 GEMMs: nothing is counted as flushed
    assert summary["lost_update_fraction"] < 0.01


def test_bf16_autocast_flushes_nothing():
    model, x, y = mlp()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    monitor = train(model, optimizer, x, y, steps=2, autocast=torch.bfloat16, every=1)
    assert monitor.records[0]["autocast"] == "bfloat16"
    assert monitor.summary()["underflow_fraction"] == 0.0
    assert monitor.summary()["nonfinite_updates"] == 0


@pytest.mark.slow
def test_gradscaler_skips_are_counted_with_their_cause():
    model, x, y = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # overflows float16 until it backs off
    monitor = train(model, optimizer, x, y, steps=30, autocast=torch.float16, scaler=scaler, every=100)
    summary = monitor.summary()
    assert 0 < summary["skipped_steps"] < 30 and summary["steps"] == 30
    first = monitor.records[0]
    assert first["skipped"] and first["scale"] == 2.0 ** 40
    assert first["skips"][0]["parameters"][0] == "4.bias"  # the last layer's: where backward meets the inf first
    assert first["first_nonfinite_backward"] is not None
    # the step after each skip is sampled too, and the first step that runs ends the series
    assert monitor.records[-1]["skipped"] is False and monitor.records[-1]["scale"] < 2.0 ** 40
    assert "step" not in vars(scaler)  # the scaler's own step method is back


def test_hooks_only_on_sampled_steps_and_none_after_close():
    model, x, y = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    seen = []
    with preclint.watch(model, optimizer, every=3):
        for step in range(4):
            loss = torch.nn.functional.mse_loss(model(x), y)
            seen.append(len(model[0]._forward_hooks))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    assert seen == [1, 0, 0, 1]
    assert not model._forward_pre_hooks and not model[0]._forward_hooks
    assert not optimizer._optimizer_step_pre_hooks and not optimizer._optimizer_step_post_hooks


def test_block_scales_of_scaled_layers():
    model, x, y = mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    monitor = train(model, optimizer, x, y, steps=1, every=1, scaled="all")
    blocks = monitor.records[0]["layers"]["2"]["blocks"]
    assert set(blocks) == {"input", "weight", "grad"}
    assert blocks["weight"]["blocks"] == 64 * 64 // 32
    assert 0 < blocks["weight"]["amax_min"] <= blocks["weight"]["amax_median"] <= blocks["weight"]["amax_p99"]
    assert "blocks" not in monitor.records[0]["layers"].get("1", {})  # a ReLU: no GEMM


def test_every_must_be_a_positive_whole_number():
    model, _, _ = mlp()
    with pytest.raises(ValueError, match="every=0"):
        preclint.watch(model, torch.optim.SGD(model.parameters(), lr=1e-2), every=0)


def test_watch_report_charts_a_run_over_its_steps(tmp_path):
    inner, x, y = mlp(torch.bfloat16)
    model = torch.nn.Sequential(OrderedDict([("odd</script><b>", inner)]))  # a module path that must stay text
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    train(model, optimizer, x, y, steps=2, every=1, path=tmp_path / "run.jsonl")
    page = preclint.watch_report(tmp_path / "run.jsonl", tmp_path / "run.html").read_text()
    assert "Lost updates per layer (the 3 with most)" in page
    assert "odd</script><b>" not in page and "odd&lt;/script&gt;&lt;b&gt;.0" in page
    assert "Loss scale" not in page  # no GradScaler, no scale chart

    scaled, x, y = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)
    optimizer = torch.optim.SGD(scaled.parameters(), lr=1e-2)
    monitor = train(scaled, optimizer, x, y, steps=2, autocast=torch.float16, scaler=scaler, every=1)
    assert "Loss scale (GradScaler) and skipped steps" in preclint.watch_report(monitor.records, tmp_path / "s.html").read_text()


def test_watch_report_of_a_file_that_is_not_json_lines(tmp_path):
    (tmp_path / "bad.jsonl").write_text("{\n")
    with pytest.raises(preclint.UserError, match="bad.jsonl:1: not a JSON line"):
        preclint.watch_report(tmp_path / "bad.jsonl", tmp_path / "bad.html")


def test_a_second_optimizer_stepped_by_the_same_scaler_is_not_a_skip():
    model, x, y = mlp()
    first = torch.optim.SGD(model[0].parameters(), lr=1e-2)
    rest = torch.optim.SGD([p for layer in (model[2], model[4]) for p in layer.parameters()], lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
    with preclint.watch(model, first, scaler=scaler, every=1) as monitor:
        for _ in range(2):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y)
            first.zero_grad()
            rest.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(first)
            scaler.step(rest)
            scaler.update()
    assert monitor.summary()["skipped_steps"] == 0 and monitor.step == 2


def test_an_inf_input_to_a_watched_layer_is_written_as_null(tmp_path):
    model, x, y = mlp()
    x = x.clone()
    x[:8] = float("inf")  # 8 of the input's 256 blocks: its p99 amax is inf
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    monitor = train(model, optimizer, x, y, steps=2, every=1, scaled="all", path=tmp_path / "run.jsonl")
    record = lines(tmp_path / "run.jsonl")[0]
    assert record["layers"]["0"]["blocks"]["input"]["amax_p99"] is None
    assert record["first_nonfinite_forward"] == "0"
    assert monitor.summary()["first_nonfinite"]["step"] == 0
