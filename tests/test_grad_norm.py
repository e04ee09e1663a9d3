"""The gradient-norm log records the norm computed by hand, and each detector fires on a planted case
(naming the step) and stays quiet on a healthy run."""
import math

import pytest
import torch
from conftest import tiny_config

from course_lib import ledger
from course_lib.engine import train
from course_lib.engine.grad_norm import LOG_FILE, GradientNormLog
from course_lib.engine.precision import grad_scaler
from course_lib.engine.step import optimizer_step, training_step


def feed(log, norms, epoch=0):
    for value in norms:
        log.add(torch.tensor(float(value)))
    return log.check(epoch, len(norms), len(norms))


@pytest.mark.parametrize("clip_norm", [0.0, 0.1])
def test_the_logged_norm_equals_the_norm_by_hand_before_clipping(clip_norm):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.ReLU(), torch.nn.Linear(4, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = grad_scaler("off", torch.device("cpu"))
    images, targets = torch.randn(8, 5), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    training_step(model, images, targets, torch.nn.CrossEntropyLoss(), scaler)
    by_hand = math.sqrt(sum(float((p.grad ** 2).sum()) for p in model.parameters()))
    log = GradientNormLog()
    optimizer_step(optimizer, scaler, clip_norm=clip_norm, norm_log=log)
    log.check(epoch=0, step=1, global_step=1)
    assert log.norms == [pytest.approx(by_hand, rel=1e-6)]
    assert by_hand > 0.1  # so the clipped case really clipped, and the log kept the norm before clipping


def test_vanishing_fires_once_with_the_step_where_the_run_of_small_norms_reaches_its_length():
    log = GradientNormLog(floor=1e-3, patience=5, factor=0)
    found = feed(log, [1.0, 0.5, 1e-4, 1e-4, 1e-4, 1e-4, 1e-5, 1e-5, 1e-5])
    assert len(found) == 1 and "\n" not in found[0]
    assert found[0].startswith("vanishing gradients at epoch 1, step 7 (run step 7)")
    assert "since epoch 1, step 3" in found[0]


def test_vanishing_counts_across_checks_and_resets_when_the_norm_recovers():
    log = GradientNormLog(floor=1e-3, patience=3, factor=0)
    assert feed(log, [1e-4, 1e-4]) == []
    log.add(torch.tensor(1e-4))
    assert log.check(0, 3, 3)[0].startswith("vanishing gradients at epoch 1, step 3")
    assert feed(GradientNormLog(floor=1e-3, patience=3, factor=0), [1e-4, 1e-4, 1.0, 1e-4, 1e-4]) == []


def test_exploding_fires_on_the_jump_and_names_its_step():
    log = GradientNormLog(floor=0, patience=1, factor=10)
    found = feed(log, [1.0, 1.1, 0.9, 1.0, 25.0, 1.0])
    assert len(found) == 1 and found[0].startswith("exploding gradients at epoch 1, step 5 (run step 5)")
    assert "25.0x the median 1 of the previous 4 steps" in found[0]


def test_non_finite_norms_are_left_to_the_scaler_and_the_loss_guard():
    assert feed(GradientNormLog(floor=1e-3, patience=1, factor=10), [1.0, 1.0, float("inf")]) == []


def test_a_healthy_run_is_quiet_and_the_engine_writes_the_log_and_the_ledger_summary(tmp_path, capsys):
    from test_train import tensor_bundle

    config = tiny_config(tmp_path, grad_norm_log=True, epochs=2, max_steps=3)
    result = train.fit(config, bundle=tensor_bundle(), progress=False)
    assert [row["global_step"] for row in result.grad_norms] == [1, 2, 3, 4, 5, 6]
    assert all(math.isfinite(row["grad_norm"]) and row["grad_norm"] > 0 for row in result.grad_norms)
    written = (tmp_path / "checkpoints" / LOG_FILE).read_text().splitlines()
    assert written[0] == "epoch,step,global_step,grad_norm" and len(written) == 7
    out = capsys.readouterr().out
    assert "gradient norms over 6 steps" in out and "no vanishing or exploding gradients" in out
    metrics = ledger.Ledger().rows(kind="train")[-1]["metrics"]
    assert metrics["grad_norm_steps"] == 6 and metrics["grad_norm_findings"] == []
    assert len(metrics["grad_norm_series"]) == 6


def test_a_planted_vanishing_run_is_named_in_the_engines_output(tmp_path, capsys):
    from test_train import tensor_bundle

    # a floor above any real norm: every step counts as vanishing, so the detector must fire at step 3
    config = tiny_config(tmp_path, grad_norm_log=True, max_steps=3, vanishing_grad_norm=1e9, vanishing_grad_steps=3)
    train.fit(config, bundle=tensor_bundle(), progress=False)
    assert "vanishing gradients at epoch 1, step 3 (run step 3)" in capsys.readouterr().out


def test_an_explosion_just_before_a_nan_loss_is_named_before_the_guard_stops_the_run(tmp_path, capsys, monkeypatch):
    from test_train import CLASSES, PoisonAfter, TensorImages

    from course_lib.data.datasets import DataBundle

    # step 3's gradient norm is planted 1000x its real value, and step 4's images are NaN: both land in the
    # same sync (the last step of the run), where the exploding line is the clue to the NaN that follows
    real_add, calls = GradientNormLog.add, []

    def add_with_a_jump_at_step_3(self, norm):
        calls.append(norm)
        real_add(self, norm * 1000 if len(calls) == 3 else norm)

    monkeypatch.setattr(GradientNormLog, "add", add_with_a_jump_at_step_3)
    bundle = DataBundle(PoisonAfter(128, start=16 * 3), TensorImages(16), None, CLASSES, "poison")
    with pytest.raises(train.NonFiniteLossError, match="step 4"):
        train.fit(tiny_config(tmp_path, grad_norm_log=True, max_steps=4), bundle=bundle, progress=False)
    assert "exploding gradients at epoch 1, step 3 (run step 3)" in capsys.readouterr().out
