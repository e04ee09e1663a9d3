"""Stochastic weight averaging: the average equals the mean of the snapshots (alone and inside fit),
the learning rate is held in the averaged epochs, BatchNorm statistics are recomputed, the run
records the average's validation scores beside the last weights' and the EMA's, and a run resumed
inside the averaged epochs ends with the uninterrupted average."""
import pytest
import torch
from conftest import CrashAfter, TensorImages, tiny_config

from course_lib import ledger
from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import train
from course_lib.engine.swa import WeightAverager


def linear_with(value):
    layer = torch.nn.Linear(2, 1)
    with torch.no_grad():
        layer.weight.fill_(value)
        layer.bias.fill_(-value)
    return layer


def test_the_average_is_the_mean_of_the_snapshots():
    averager = WeightAverager(linear_with(0.0), epochs=5, swa_epochs=3)
    assert [averager.holds_lr(epoch) for epoch in range(5)] == [False, False, True, True, True]
    assert not averager.update(linear_with(100.0), epoch=1)  # before the window: not averaged
    for epoch, value in zip((2, 3, 4), (1.0, 2.0, 6.0)):
        assert averager.update(linear_with(value), epoch)
    assert averager.snapshots == 3
    assert averager.module.weight.tolist() == [[pytest.approx(3.0)] * 2]
    assert averager.module.bias.item() == pytest.approx(-3.0)


def bundle():
    return DataBundle(TensorImages(48), TensorImages(16, seed=1), None, ["a", "b", "c", "d"], "tensors")


def parameters_of(model):
    return {name: tensor.detach().clone() for name, tensor in model.named_parameters()}


def recording_snapshots(monkeypatch):
    """Wrap WeightAverager.update to keep the parameters it averages."""
    snapshots, original = [], WeightAverager.update

    def update(self, model, epoch):
        if self.holds_lr(epoch):
            snapshots.append(parameters_of(model))
        return original(self, model, epoch)

    monkeypatch.setattr(WeightAverager, "update", update)
    return snapshots


def test_fit_averages_the_last_epochs_and_scores_the_average(tmp_path, monkeypatch):
    snapshots = recording_snapshots(monkeypatch)
    config = tiny_config(tmp_path, epochs=4, swa_epochs=2, ema_decay=0.9, max_steps=3)
    result = train.fit(config, bundle=bundle(), progress=False, verbose=False)

    assert len(snapshots) == 2 and result.swa_model is not None
    for name, tensor in parameters_of(result.swa_model).items():
        torch.testing.assert_close(tensor, (snapshots[0][name] + snapshots[1][name]) / 2, msg=name)
    # the learning rate is held in the averaged epochs (3 and 4) at the value epoch 3 began with
    rates = {row["epoch"]: row["lr"] for row in result.step_log}
    held = [row["lr"] for row in result.step_log if row["epoch"] >= 3]
    assert len(held) == 6 and len(set(held)) == 1 and held[0] < config.lr
    assert rates[1] != held[0]
    # update_bn recomputed the average's BatchNorm statistics (the copy made at the start had 0 means)
    means = [m.running_mean for m in result.swa_model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert means and any(mean.abs().sum() > 0 for mean in means)
    final = result.final
    for column in ("val_top1", "ema_val_top1", "swa_val_top1", "swa_val_loss"):
        assert column in final, column
    metrics = ledger.Ledger().rows(kind="train")[0]["metrics"]
    assert metrics["swa_snapshots"] == 2 and metrics["swa_val_top1"] == final["swa_val_top1"]


@pytest.mark.slow
def test_a_run_resumed_inside_the_averaged_epochs_ends_with_the_same_average(tmp_path):
    config = tiny_config(tmp_path, epochs=4, swa_epochs=2, max_steps=3, output_dir=str(tmp_path / "whole"))
    whole = train.fit(config, bundle=bundle(), progress=False, verbose=False)
    interrupted = config.replace(output_dir=str(tmp_path / "interrupted"))
    data = bundle()
    crashing = DataBundle(CrashAfter(data.train, limit=16 * 3 * 3 + 10), data.val, None, data.classes, "crash")
    with pytest.raises(KeyboardInterrupt):  # dies in epoch 4, after epoch 3's snapshot was saved
        train.fit(interrupted, bundle=crashing, progress=False, verbose=False)
    resumed = train.fit(interrupted.replace(resume=True), bundle=data, progress=False, verbose=False)
    for name, tensor in parameters_of(whole.swa_model).items():
        torch.testing.assert_close(parameters_of(resumed.swa_model)[name], tensor, rtol=0, atol=0, msg=name)
    assert resumed.final["swa_val_top1"] == pytest.approx(whole.final["swa_val_top1"])


@pytest.mark.parametrize("epochs, swa_epochs", [(3, 3), (2, 5), (3, -1)])
def test_swa_epochs_outside_the_run_are_refused_in_one_line(epochs, swa_epochs):
    with pytest.raises(ConfigError) as error:
        make_config("smoke", epochs=epochs, swa_epochs=swa_epochs)
    message = str(error.value)
    assert message.startswith(f"swa_epochs must be 0 (off) up to epochs - 1 ({epochs - 1}), got {swa_epochs}")
    assert "\n" not in message


def test_early_stopping_before_the_averaging_began_is_said_not_silent(tmp_path, capsys):
    """swa_epochs=2 of 6 with early stopping after epoch 2: SWA never ran, and nothing said so (issue 49)."""
    config = tiny_config(tmp_path, epochs=6, swa_epochs=2, max_steps=2, lr=1e-12, early_stopping_patience=1)
    result = train.fit(config, bundle=bundle(), progress=False, verbose=True)  # lr 1e-12: top-1 never rises
    stopped = result.stopped_early_after
    assert stopped is not None and stopped < 5 and result.swa_model is None  # the averaging would begin at epoch 5
    out = capsys.readouterr().out
    assert f"SWA: nothing averaged: the run stopped after epoch {stopped}, before epoch 5, the first of the last 2" in out
    assert ledger.Ledger().rows(kind="train")[-1]["metrics"]["swa_snapshots"] == 0
