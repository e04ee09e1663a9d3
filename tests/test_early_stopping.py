"""The best epoch and early stopping: the tracker on a planted validation curve, and fit on the same
curve (validation planted through a stand-in for train.validate): it stops at the plateau, says so in
the result and the ledger, and best.pt holds the best epoch's weights."""
import pytest
import torch
from conftest import TensorImages, tiny_config

from course_lib import ledger
from course_lib.config import ConfigError, make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import train
from course_lib.engine.early_stopping import ValidationTracker
from course_lib.models import checkpoint

# Validation top-1 per epoch: rises to 0.7 at epoch 3, then a plateau that never beats it (a tie
# at epoch 4 is no improvement), so patience 3 stops after epoch 6; epoch 7 would have been higher.
PLANTED = [0.5, 0.6, 0.7, 0.7, 0.65, 0.69, 0.8, 0.9]


def test_the_tracker_stops_at_the_planted_plateau():
    tracker = ValidationTracker(patience=3)
    stopped = None
    for epoch, top1 in enumerate(PLANTED, start=1):
        tracker.update(epoch, top1)
        if tracker.should_stop:
            stopped = epoch
            break
    assert stopped == 6 and tracker.best_epoch == 3 and tracker.best_top1 == 0.7
    rebuilt = ValidationTracker.from_history([{"epoch": e, "val_top1": t} for e, t in enumerate(PLANTED[:6], 1)], 3)
    assert (rebuilt.best_epoch, rebuilt.stale_epochs, rebuilt.should_stop) == (3, 3, True)


def test_patience_zero_never_stops():
    tracker = ValidationTracker(patience=0)
    for epoch in range(1, 50):
        tracker.update(epoch, 0.5)
    assert not tracker.should_stop and tracker.best_epoch == 1


def bundle():
    return DataBundle(TensorImages(32), TensorImages(8, seed=1), None, ["a", "b", "c", "d"], "tensors")


def planted_validation(monkeypatch, curve):
    """Replace train.validate: the raw weights score `curve` epoch by epoch; returns the weights seen per epoch."""
    seen = []

    def validate(model, state, views=1):
        seen.append({k: v.detach().clone() for k, v in state.raw_model.state_dict().items()})
        return {"loss": 1.0 - curve[len(seen) - 1], "top1": curve[len(seen) - 1], "top5": 1.0, "images": 8}

    monkeypatch.setattr(train, "validate", validate)
    return seen


def test_fit_stops_at_the_plateau_and_best_pt_holds_the_best_epoch(tmp_path, monkeypatch):
    seen = planted_validation(monkeypatch, PLANTED)
    config = tiny_config(tmp_path, epochs=8, max_steps=2, save_best=True, early_stopping_patience=3)
    result = train.fit(config, bundle=bundle(), progress=False, verbose=False)

    assert len(result.history) == 6 and result.stopped_early_after == 6
    assert (result.best_epoch, result.best_val_top1) == (3, 0.7)
    assert result.best_checkpoint_path == result.checkpoint_path.with_name(checkpoint.BEST_NAME)
    best = checkpoint.load_checkpoint(result.best_checkpoint_path)
    assert best["epoch"] == 3 and best["history"][-1]["val_top1"] == 0.7
    for name, tensor in seen[2].items():  # the weights validated after epoch 3
        assert torch.equal(best["model"][name], tensor), name
    assert checkpoint.load_checkpoint(result.checkpoint_path)["epoch"] == 6  # last.pt is still the last epoch
    metrics = ledger.Ledger().rows(kind="train")[0]["metrics"]
    assert metrics["stopped_early_after"] == 6 and metrics["best_epoch"] == 3 and metrics["epochs_completed"] == 6


def test_without_patience_every_epoch_runs_and_the_best_is_still_named(tmp_path, monkeypatch):
    planted_validation(monkeypatch, [0.3, 0.9, 0.4])
    result = train.fit(tiny_config(tmp_path, epochs=3, max_steps=1), bundle=bundle(), progress=False, verbose=False)
    assert len(result.history) == 3 and result.stopped_early_after is None and result.best_epoch == 2
    assert result.best_checkpoint_path is None and not result.checkpoint_path.with_name(checkpoint.BEST_NAME).exists()


def test_a_resumed_run_that_had_stopped_trains_no_further(tmp_path, monkeypatch):
    planted_validation(monkeypatch, PLANTED + PLANTED)
    config = tiny_config(tmp_path, epochs=8, max_steps=1, early_stopping_patience=3)
    train.fit(config, bundle=bundle(), progress=False, verbose=False)
    resumed = train.fit(config.replace(resume=True), bundle=bundle(), progress=False, verbose=False)
    assert len(resumed.history) == 6 and resumed.stopped_early_after == 6 and resumed.best_epoch == 3


@pytest.mark.parametrize("switch", [{"save_best": True}, {"early_stopping_patience": 2}])
def test_choosing_without_validation_is_refused_in_one_line(tmp_path, switch):
    no_validation = DataBundle(TensorImages(32), None, None, ["a", "b", "c", "d"], "tensors")
    with pytest.raises(ConfigError) as error:
        train.fit(tiny_config(tmp_path, **switch), bundle=no_validation, progress=False, verbose=False)
    assert "choose by validation top-1" in str(error.value) and "\n" not in str(error.value)


def test_a_negative_patience_is_refused_in_one_line():
    with pytest.raises(ConfigError) as error:
        make_config("smoke", early_stopping_patience=-1)
    assert str(error.value) == "early_stopping_patience must be 0 (off) or more epochs, got -1"
    with pytest.raises(ConfigError, match="save_best must be true or false"):
        make_config("smoke", save_best="yes")
