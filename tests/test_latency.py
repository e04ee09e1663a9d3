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


def test_speed_row_puts_an_mfu_next_to_each_speed():
    from course_lib.deploy.latency import forward_flops_per_image

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Flatten(), torch.nn.LazyLinear(2)).eval()
    model(torch.randn(1, 3, 8, 8))
    flops = forward_flops_per_image(model, 8)
    # conv: 2 * 36 output pixels * 4 channels * 27 inputs; linear: 2 * 144 * 2
    assert flops == pytest.approx(2 * 36 * 4 * 27 + 2 * 144 * 2)
    row = speed_row(model, 8, batch_sizes=(1,), flops_per_image=flops, repeats=1, warmup=0, min_images=1)
    assert list(row) == ["ms@1", "images/s@1", "MFU@1"] and row["MFU@1"] > 0
