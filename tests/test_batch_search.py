"""The largest-batch finder: doubling then bisection, against a fake memory cap, a fake out-of-memory
error and a real model."""
import pytest
import torch
from torch import nn

from course_lib.measure import batch_search, memory_probe


def test_find_largest_batch_against_fake_memory_cap():
    bytes_per_image, fixed = 1000, 500
    search = batch_search.find_largest_batch(lambda b: fixed + bytes_per_image * b, memory_cap_bytes=37_000)
    assert search.largest_batch == 36  # 500 + 36 * 1000 <= 37000 < 500 + 37 * 1000
    assert [t["batch_size"] for t in search.trials][:7] == [1, 2, 4, 8, 16, 32, 64]
    assert all(t["fits"] == (t["batch_size"] <= 36) for t in search.trials)


def test_find_largest_batch_to_a_multiple():
    search = batch_search.find_largest_batch(lambda b: 1000 * b, memory_cap_bytes=37_000, multiple_of=8)
    assert search.largest_batch == 32  # 40 would not fit; the search stops at 8-image resolution
    assert [t["batch_size"] for t in search.trials] == [1, 2, 4, 8, 16, 32, 64, 48, 40]


@pytest.mark.slow
def test_find_largest_batch_against_fake_oom():
    def step(batch_size):
        if batch_size > 12:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return batch_size

    search = batch_search.find_largest_batch(step, start=2)
    assert search.largest_batch == 12
    assert any(t["reason"] == "out of memory" for t in search.trials)


def test_find_largest_batch_respects_max_and_reraises_other_errors():
    assert batch_search.find_largest_batch(lambda b: 0, max_batch=100).largest_batch == 100

    def broken(batch_size):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        batch_search.find_largest_batch(broken)


def test_find_largest_batch_on_a_real_model_leaves_it_usable():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(8, 10))
    probe = memory_probe.TrainingStepProbe(model, image_size=16)
    cap = probe.peak_bytes(6)
    search = batch_search.find_largest_batch(probe.peak_bytes, memory_cap_bytes=cap, max_batch=64)
    assert 6 <= search.largest_batch < 12
    assert all(p.grad is None for p in probe.module.parameters())  # nothing left from the failed steps
    assert probe.peak_bytes(search.largest_batch) <= cap  # and it still trains
