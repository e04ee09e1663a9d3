"""The epoch meter's arithmetic: loss, top-1, images/s, data wait and per-step rows, for one
process and as summed across ranks under DDP."""
import pytest
import torch

from course_lib.engine import epoch_meter
from course_lib.engine.epoch_meter import EpochMeter, correct_counts


def one_hot_logits(predicted, num_classes=4):
    return torch.nn.functional.one_hot(torch.tensor(predicted), num_classes).float()


def test_correct_counts_top1_and_top5():
    logits = torch.tensor([[0.0, 3.0, 2.0, 1.0], [3.0, 2.0, 1.0, 0.0]])
    top1, top3 = correct_counts(logits, torch.tensor([1, 2]), top=3)
    assert (top1.item(), top3.item()) == (1, 2)
    top1, top5 = correct_counts(logits, torch.tensor([1, 3]))  # top-5 of 4 classes: every class
    assert (top1.item(), top5.item()) == (1, 2)


def filled_meter(world_size=1, distributed=False):
    meter = EpochMeter("cpu", distributed, world_size)
    meter.start()
    meter.add(one_hot_logits([0, 1, 2, 3]), torch.tensor([0, 1, 0, 0]))  # 2 of 4 right
    meter.add(one_hot_logits([1, 1, 1, 1]), torch.tensor([1, 1, 1, 0]))  # 3 of 4 right
    meter.add_step(0.1)
    meter.add_losses(torch.tensor([1.0, 3.0]))
    meter.stop()
    meter.epoch_seconds, meter.timer.wait_seconds = 4.0, 1.0  # a known clock
    meter.process_cpu_seconds = 0.0
    return meter


def test_row_arithmetic_for_one_process():
    row = filled_meter().row()
    assert row["train_loss"] == pytest.approx(2.0)
    assert row["train_top1"] == pytest.approx(5 / 8)
    assert row["images_per_second"] == pytest.approx(8 / 4.0)
    assert row["data_wait_fraction"] == pytest.approx(1.0 / 4.0)
    assert row["epoch_seconds"] == pytest.approx(4.0)
    assert row["process_cpu_seconds"] == 0.0  # filled_meter's known clock: no CPU time between start and stop


def test_process_cpu_seconds_counts_the_work_between_start_and_stop(monkeypatch):
    clock = iter([10.0, 12.5])  # process_time() at start, then at stop: 2.5 s of CPU in the epoch
    monkeypatch.setattr(epoch_meter.time, "process_time", lambda: next(clock))
    meter = EpochMeter("cpu", False, 1)
    meter.start()
    meter.add(one_hot_logits([0, 1]), torch.tensor([0, 1]))
    meter.add_losses(torch.tensor([1.0]))
    meter.stop()
    assert meter.row()["process_cpu_seconds"] == pytest.approx(2.5)


def test_row_sums_ranks_and_divides_time_by_the_world_size(monkeypatch):
    # Two ranks that counted the same: the all-reduce doubles every count.
    monkeypatch.setattr(epoch_meter.dist, "all_reduce", lambda tensor: tensor.mul_(2))
    row = filled_meter(world_size=2, distributed=True).row()
    assert row["train_top1"] == pytest.approx(10 / 16)
    assert row["images_per_second"] == pytest.approx(16 / 4.0)  # all images over one rank's time
    assert row["data_wait_fraction"] == pytest.approx(2.0 / 8.0)
    assert row["epoch_seconds"] == pytest.approx(4.0)


def test_step_rows_average_each_steps_micro_batches():
    meter = EpochMeter("cpu")
    for rate in (0.1, 0.2):
        meter.add_step(rate)
    meter.add_losses(torch.tensor([1.0, 3.0, 5.0]))
    meter.add_losses(torch.tensor([7.0]))
    assert meter.step_rows(epoch=2, first_global_step=10, accumulation_steps=2) == [
        {"epoch": 3, "step": 11, "lr": 0.1, "loss": 2.0}, {"epoch": 3, "step": 12, "lr": 0.2, "loss": 6.0}]
