"""Inference speed rows: per-batch milliseconds and images per second that agree with each other."""
import pytest
import torch

from course_lib.deploy.latency import inference_speed, speed_row


def test_speed_is_consistent():
    model = torch.nn.Conv2d(3, 4, 3).eval()
    speed = inference_speed(model, 8, 16, repeats=2, warmup=1)
    assert speed["batch_size"] == 8 and speed["milliseconds"] > 0
    assert speed["images_per_second"] == pytest.approx(8 / (speed["milliseconds"] / 1e3))


def test_speed_row_has_a_column_per_batch_size():
    row = speed_row(torch.nn.Identity(), 8, batch_sizes=(1, 4), repeats=1, warmup=0, min_images=1)
    assert set(row) == {"ms@1", "images/s@1", "ms@4", "images/s@4"}
