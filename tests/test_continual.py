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


def test_replay_in_balance_repeats_each_class_to_the_new_classes_count():
    targets = [0] * 10 + [1] * 10 + [2] * 10
    memory = [0, 1, 10, 11, 12, 13, 20]  # 2, 4 and 1 stored images of classes 0, 1, 2
    replayed = continual.replay_in_balance(memory, targets, images_per_class=8)
    assert np.bincount(np.asarray(targets)[replayed]).tolist() == [8, 8, 8]
    assert set(replayed) == set(memory)
    assert continual.replay_in_balance(memory, targets, images_per_class=1) == memory  # never fewer than once


def test_task_bundles_hold_the_right_classes():
    train, val = _dataset([5, 5, 5, 5]), _dataset([2, 2, 2, 2])
    bundle = DataBundle(train=train, val=val, test=None, classes=list("abcd"), source="test")
    split = continual.ClassSplit.first(4, 2)
    first = continual.task_bundle(bundle, split)
    assert first.classes == ["a", "b"] and set(first.train.targets) == {0, 1} and set(first.val.targets) == {0, 1}
    naive = continual.task_bundle(bundle, split, "naive")
    assert set(naive.train.targets) == {2, 3} and naive.classes == list("abcd")
    unbalanced = continual.task_bundle(bundle, split, "rehearsal", memory_per_class=3, balanced=False)
    assert np.bincount(unbalanced.train.targets).tolist() == [3, 3, 5, 5]
    rehearsal = continual.task_bundle(bundle, split, "rehearsal", memory_per_class=3)  # replayed twice: 6 ~ 5
    assert np.bincount(rehearsal.train.targets).tolist() == [6, 6, 5, 5]
    assert len(set(rehearsal.train.indices)) == 3 + 3 + 5 + 5  # the same 3 images per old class, seen twice
    with pytest.raises(ConfigError, match="old_classes"):
        continual.ClassSplit.first(4, 4)


def test_widen_head_keeps_the_old_classes_rows():
    model = timm.create_model("test_resnet", num_classes=3).eval()
    wider = continual.widen_head(model, 5).eval()
    images = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(wider(images)[:, :3], model(images), atol=1e-5)
    assert wider(images).shape == (2, 5) and model.get_classifier().out_features == 3


@pytest.mark.slow
def test_rehearsal_and_lwf_keep_more_of_the_old_classes_than_naive_fine_tuning(tmp_path):
    """A small fixed task (scikit-learn's digits, 5 old + 5 new classes, timm's test_resnet at 16 px):
    naive fine-tuning on the new classes forgets the old ones; the balanced rehearsal memory and
    Learning without Forgetting must each keep clearly more of them, or the method does nothing."""
    from course_lib.chapters import compress_and_deploy
    from course_lib.config import make_config
    from course_lib.data import pipeline
    from course_lib.engine import train

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = make_config("smoke", dataset="digits", image_size=16, batch_size=32, max_steps=0,
                             max_train_images=0, epochs=4, lr=0.05, output_dir=str(tmp_path))
        bundle = pipeline.build_datasets(config)
        # notebook 13's section 5: step 1 on the old classes, then each strategy's step 2 from the same model
        split = continual.ClassSplit.first(len(bundle.classes), 5)
        groups = {"old classes": split.old, "new classes": split.new}
        first = train.fit(config.replace(output_dir=str(tmp_path / "old")), bundle=continual.task_bundle(bundle, split),
                          progress=False, verbose=False)
        rows = [{"strategy": "step 1: old classes only",
                 **continual.accuracy_by_group(first.model, bundle.val, config, groups, bundle.device_stage)}]
        for strategy in continual.STRATEGIES:
            result = continual.learn_new_classes(first.model, config.replace(output_dir=str(tmp_path / strategy)),
                                                 bundle, split, strategy, memory_per_class=10,
                                                 distillation_weight=compress_and_deploy.LWF_WEIGHT,
                                                 progress=False, verbose=False)
            rows.append({"strategy": f"step 2: {strategy}",
                         **continual.accuracy_by_group(result.model, bundle.val, config, groups, bundle.device_stage)})
    finally:
        torch.set_num_threads(previous)
    old = {row["strategy"].removeprefix("step 2: "): row["old classes"] for row in rows}
    assert old["step 1: old classes only"] > 0.9  # the old classes were learned first
    assert old["rehearsal"] >= old["naive"] + 0.3, old
    assert old["lwf"] >= old["naive"] + 0.1, old
    new = {row["strategy"].removeprefix("step 2: "): row["new classes"] for row in rows}
    assert new["rehearsal"] > 0.8 and new["lwf"] > 0.3, new  # and both still learn the new classes
