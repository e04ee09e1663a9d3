"""Continual learning: class subsets, a class-balanced rehearsal memory, a head that grows."""
import numpy as np
import pytest
import timm
import torch

from course_lib.config import ConfigError
from course_lib.data.datasets import DataBundle
from course_lib.engine import continual


class Labelled(torch.utils.data.Dataset):
    """`counts[c]` random images of each class c."""

    def __init__(self, counts):
        self.targets = [label for label, count in enumerate(counts) for _ in range(count)]
        self.images = torch.randn(len(self.targets), 3, 8, 8)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], self.targets[index]


def _dataset(counts):
    return Labelled(counts)


def test_rehearsal_memory_is_balanced_per_class():
    dataset = _dataset([30, 12, 50, 3])
    memory = continual.rehearsal_memory(dataset, [0, 1, 2, 3], per_class=10, seed=0)
    counts = np.bincount(np.asarray(dataset.targets)[memory], minlength=4)
    assert counts.tolist() == [10, 10, 10, 3]  # a class with fewer images gives all it has
    assert len(set(memory)) == len(memory)
    assert continual.rehearsal_memory(dataset, [0, 1], 10, seed=0) != continual.rehearsal_memory(dataset, [0, 1], 10, seed=1)


def test_task_bundles_hold_the_right_classes():
    train, val = _dataset([5, 5, 5, 5]), _dataset([2, 2, 2, 2])
    bundle = DataBundle(train=train, val=val, test=None, classes=list("abcd"), source="test")
    split = continual.ClassSplit.first(4, 2)
    first = continual.task_bundle(bundle, split)
    assert first.classes == ["a", "b"] and set(first.train.targets) == {0, 1} and set(first.val.targets) == {0, 1}
    naive = continual.task_bundle(bundle, split, "naive")
    assert set(naive.train.targets) == {2, 3} and naive.classes == list("abcd")
    rehearsal = continual.task_bundle(bundle, split, "rehearsal", memory_per_class=3)
    assert np.bincount(rehearsal.train.targets).tolist() == [3, 3, 5, 5]
    with pytest.raises(ConfigError, match="old_classes"):
        continual.ClassSplit.first(4, 4)


def test_widen_head_keeps_the_old_classes_rows():
    model = timm.create_model("test_resnet", num_classes=3).eval()
    wider = continual.widen_head(model, 5).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(wider(images)[:, :3], model(images), atol=1e-5)
    assert wider(images).shape == (2, 5) and model.get_classifier().out_features == 3
