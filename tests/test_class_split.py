"""Source and target tasks cut from one dataset by class: disjoint classes, exact labels per class,
relabelling, and the EuroSAT split when the shared copy is present."""
import numpy as np
import pytest
from conftest import TensorImages

from course_lib.config import ConfigError
from course_lib.data import class_split
from course_lib.data.datasets import DataBundle

CLASSES = [f"class{i}" for i in range(10)]


def bundle(train=200, val=50):
    train_set, val_set = TensorImages(train, len(CLASSES)), TensorImages(val, len(CLASSES), seed=1)
    train_set.classes = val_set.classes = CLASSES
    return DataBundle(train_set, val_set, None, CLASSES, "tensors")


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_split_classes_is_disjoint_complete_and_seeded(seed):
    source, target = class_split.split_classes(CLASSES, 3, seed)
    assert len(target) == 3 and len(source) == 7
    assert not set(source) & set(target) and set(source) | set(target) == set(CLASSES)
    assert source == [c for c in CLASSES if c in source]  # the dataset's order
    assert class_split.split_classes(CLASSES, 3, seed) == (source, target)


def test_split_classes_refuses_impossible_counts():
    for count in (0, 10, 11):
        with pytest.raises(ConfigError, match="target_classes must be 1 to 9"):
            class_split.split_classes(CLASSES, count)


@pytest.mark.parametrize("per_class", [1, 5, 20])
def test_sample_per_class_takes_exactly_that_many_of_each_wanted_class(per_class):
    targets = np.arange(200) % 10
    chosen = class_split.sample_per_class(targets, [2, 5, 9], per_class, seed=3)
    labels, counts = np.unique(targets[chosen], return_counts=True)
    assert labels.tolist() == [2, 5, 9] and counts.tolist() == [per_class] * 3
    assert chosen == sorted(set(chosen))
    assert chosen != class_split.sample_per_class(targets, [2, 5, 9], per_class, seed=4) or per_class == 20
    assert len(class_split.sample_per_class(targets, [2, 5], 0)) == 40  # 0: every image of those classes
    with pytest.raises(ConfigError, match=r"^per_class=21 asks for more .* than class 2 has \(20\); "
                                          r"set -p per_class=N with N <= 20$"):
        class_split.sample_per_class(targets, [2], 21)
    with pytest.raises(ConfigError, match=r"^source_per_class=21 .* set -p source_per_class=N with N <= 20$"):
        class_split.sample_per_class(targets, [2], 21, parameter="source_per_class")


def test_subset_bundle_relabels_and_keeps_validation_whole():
    whole = bundle()
    target = class_split.subset_bundle(whole, ["class9", "class2"], per_class=4, seed=0)
    assert target.classes == ["class9", "class2"] and target.num_classes == 2
    assert len(target.train) == 8 and sorted(target.train.targets) == [0] * 4 + [1] * 4
    assert len(target.val) == 10  # every validation image of the two classes (50 images, 10 classes)
    for index in range(len(target.train)):
        image, label = target.train[index]
        original = whole.train.targets[target.train.indices[index]]
        assert label == {9: 0, 2: 1}[int(original)] == target.train.targets[index]
    assert target.device_stage is whole.device_stage and "2 classes, 4 labels per class" in target.source
    sampled = class_split.subset_bundle(whole, ["class9", "class2"], per_class=4, seed=1, val_per_class=3)
    assert len(sampled.val) == 6 and sampled.val.indices == class_split.subset_bundle(
        whole, ["class9", "class2"], per_class=4, seed=2, val_per_class=3).val.indices  # the same for every seed
    assert sampled.train.indices != target.train.indices
    assert len(class_split.subset_bundle(whole, ["class9"], val_per_class=99).val) == 5  # capped, not refused
    with pytest.raises(ConfigError, match="not in the data"):
        class_split.subset_bundle(whole, ["nope"])


def test_eurosat_source_and_target_are_disjoint(eurosat_dir):
    from course_lib.data.datasets import ImageFolderDataset

    listing = ImageFolderDataset(eurosat_dir / "train")
    source, target = class_split.split_classes(listing.classes, 3, seed=0)
    assert len(listing.classes) == 10 and not set(source) & set(target)
    chosen = class_split.sample_per_class(listing.targets, [listing.classes.index(c) for c in target], 10, seed=0)
    assert len(chosen) == 30 and {listing.classes[listing.targets[i]] for i in chosen} == set(target)
