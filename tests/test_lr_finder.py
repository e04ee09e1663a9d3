"""The LR range test finds a minimum below the divergence point and stops once the loss blows up."""
import math

import pytest
import torch

from course_lib.config import make_config
from course_lib.data.datasets import DataBundle
from course_lib.engine import lr_finder


class Separable(torch.utils.data.Dataset):
    def __init__(self, count=64):
        generator = torch.Generator().manual_seed(0)
        self.targets = torch.arange(count) % 4
        self.images = torch.randn(count, 3, 8, 8, generator=generator) * 0.3 + self.targets.view(-1, 1, 1, 1)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])


def test_range_test_finds_a_stable_lr_and_detects_divergence():
    # min_lr above start_lr: a schedule's floor must not stop the range test (config refuses min_lr > lr)
    config = make_config("smoke", model="test_resnet", batch_size=16, precision="off", optimizer="sgd", image_size=8,
                         min_lr=1e-3)
    bundle = DataBundle(Separable(), None, None, list("abcd"), "tensors")
    result = lr_finder.lr_range_test(config, bundle, start_lr=1e-4, end_lr=1e4, steps=40)
    assert result.diverged_at is not None and len(result.losses) < 40  # stopped early
    assert 1e-4 <= result.largest_stable_lr < result.diverged_at
    lowest = min(result.smoothed_losses)
    assert result.smoothed_losses[result.learning_rates.index(result.largest_stable_lr)] == lowest
    assert all(b / a == pytest.approx(result.learning_rates[1] / result.learning_rates[0])
               for a, b in zip(result.learning_rates, result.learning_rates[1:]))
    assert math.isfinite(lowest)
