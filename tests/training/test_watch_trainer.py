"""preclint.watch.TrainerCallback: a transformers.TrainerCallback that watches the Trainer's model and
optimizer from on_train_begin to on_train_end. The Trainer itself needs accelerate, which this environment
lacks, so the events are sent as the Trainer's CallbackHandler sends them (model=, optimizer= keywords)."""
import json

import pytest
import torch

import preclint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow


def test_trainer_callback_watches_from_begin_to_end(tmp_path, capsys):
    callback = preclint.watch.TrainerCallback(every=2, path=str(tmp_path / "trainer.jsonl"))
    assert isinstance(callback, transformers.TrainerCallback)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(torch.bfloat16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    args, state, control = None, transformers.TrainerState(), transformers.TrainerControl()
    callback.on_train_begin(args, state, control, model=model, optimizer=optimizer)
    x, y = torch.randn(16, 8, dtype=torch.bfloat16), torch.randn(16, 1, dtype=torch.bfloat16)
    for _ in range(3):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        callback.on_step_end(args, state, control, model=model, optimizer=optimizer)
    callback.on_train_end(args, state, control, model=model, optimizer=optimizer)
    records = [json.loads(line) for line in (tmp_path / "trainer.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2]
    assert records[0]["totals"]["lost_update_fraction"] > 0.9
    assert "lost updates" in capsys.readouterr().err
    assert not optimizer._optimizer_step_pre_hooks  # closed at the end of training


def test_trainer_callback_without_transformers_says_so(monkeypatch):
    from preclint.training import watch_trainer

    watch_trainer.trainer_callback.cache_clear()
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    try:
        with pytest.raises(ImportError, match="needs transformers"):
            preclint.watch.TrainerCallback
    finally:
        watch_trainer.trainer_callback.cache_clear()
