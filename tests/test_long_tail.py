"""The long-tailed subset: counts n_max x ratio^(-k/(C-1)), a seeded draw of that many images per
class, and subsets of a map-style split and of a resident (storage=device) split."""
import numpy as np
import pytest
import torch
from conftest import TensorImages

from course_lib.config import ConfigError
from course_lib.data import long_tail
from course_lib.data.class_split import targets_of
from course_lib.data.datasets import DataBundle
from course_lib.data.resident import ResidentSplit


def test_counts_fall_geometrically_from_head_to_tail():
    counts = long_tail.long_tail_counts([100] * 5, 10)
    assert counts == [100, 56, 31, 17, 10]  # 100 x 10^(-k/4), rounded down
    assert counts[0] / counts[-1] == 10
    assert long_tail.long_tail_counts([30, 20, 50], 1) == [20, 20, 20]  # ratio 1: balanced at the smallest class
    assert long_tail.long_tail_counts([200, 200], 10) == [200, 20]  # no image lost to float rounding


@pytest.mark.parametrize("ratio", [0.5, float("nan"), float("inf")])
def test_a_bad_ratio_is_refused_in_one_line(ratio):
    with pytest.raises(ConfigError, match="imbalance_ratio must be 1"):
        long_tail.long_tail_counts([10, 10], ratio)


def test_indices_hold_the_counts_per_class_and_follow_the_seed():
    targets = np.arange(400) % 4
    chosen = long_tail.long_tail_indices(targets, 4, 8, seed=0)
    assert np.bincount(targets[chosen], minlength=4).tolist() == long_tail.long_tail_counts([100] * 4, 8)
    assert chosen == sorted(set(chosen))  # sorted, no image twice
    assert chosen == long_tail.long_tail_indices(targets, 4, 8, seed=0)
    assert chosen != long_tail.long_tail_indices(targets, 4, 8, seed=1)


def test_the_bundle_keeps_validation_and_cuts_training():
    bundle = DataBundle(TensorImages(80), TensorImages(16, seed=1), None, ["a", "b", "c", "d"], "tensors")
    cut = long_tail.long_tail_bundle(bundle, 5, seed=0)
    counts = np.bincount(targets_of(cut.train), minlength=4).tolist()
    assert counts == [20, 11, 6, 4] and len(cut.train) == sum(counts)
    assert cut.val is bundle.val and "imbalance ratio 5" in cut.source
    image, label = cut.train[len(cut.train) - 1]
    parent = cut.train.indices[-1]
    assert torch.equal(image, bundle.train[parent][0]) and label == int(bundle.train.targets[parent])


def test_a_resident_split_gives_a_resident_subset():
    targets = torch.arange(40) % 2
    images = torch.arange(40, dtype=torch.uint8).view(40, 1, 1, 1).expand(40, 3, 4, 4).contiguous()
    cut = long_tail.long_tail_split(ResidentSplit(images, targets, ["x", "y"]), 2, 4, seed=0)
    assert isinstance(cut, ResidentSplit)
    assert np.bincount(cut.targets).tolist() == [20, 5]
    assert all(int(cut.images[i, 0, 0, 0]) % 2 == cut.targets[i] for i in range(len(cut)))  # rows and labels agree
