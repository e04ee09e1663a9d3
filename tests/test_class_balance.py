"""class_balance: the inverse-frequency loss weights against the hand formula, the class-balanced
sampler's class frequencies (DataLoader and storage=device paths), and the switch's one-line errors."""
import numpy as np
import pytest
import torch
from conftest import tiny_config

from course_lib.config import ConfigError, make_config
from course_lib.data import class_balance
from course_lib.data.datasets import DataBundle
from course_lib.data.resident import ResidentBatches, ResidentSplit
from course_lib.engine import train
from course_lib.engine.label_smoothing import make_criterion

CLASSES = ["head", "middle", "tail"]
COUNTS = [48, 12, 4]  # 64 training images, imbalance ratio 12


class LabelledImages(torch.utils.data.Dataset):
    """Random 16 px float images with the given labels (mean shifted by the label, so learnable)."""

    def __init__(self, targets, size=16, seed=0):
        self.targets = torch.as_tensor(targets)
        generator = torch.Generator().manual_seed(seed)
        self.images = torch.randn(len(self.targets), 3, size, size, generator=generator) + self.targets.view(-1, 1, 1, 1)

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, index):
        return self.images[index], int(self.targets[index])


def imbalanced_targets(counts=COUNTS):
    return np.repeat(np.arange(len(counts)), counts)


def imbalanced_bundle():
    return DataBundle(LabelledImages(imbalanced_targets()), LabelledImages(np.arange(12) % 3, seed=1), None, CLASSES,
                      "imbalanced tensors")


def test_class_weights_are_n_over_classes_times_count():
    weights = class_balance.class_weights(class_balance.class_counts(imbalanced_targets(), 3))
    assert weights.tolist() == pytest.approx([64 / (3 * 48), 64 / (3 * 12), 64 / (3 * 4)])
    # each class carries the same total weight, and the weights average 1 over the images
    assert (weights * torch.tensor(COUNTS)).tolist() == pytest.approx([64 / 3] * 3)
    assert class_balance.class_weights([5, 0, 5]).tolist() == pytest.approx([1.0, 0.0, 1.0])  # an absent class: 0


def test_the_weighted_loss_equals_the_hand_formula(tmp_path):
    torch.manual_seed(0)
    logits, targets = torch.randn(10, 3), torch.tensor([0, 0, 0, 0, 0, 1, 1, 2, 0, 1])
    weights = class_balance.class_weights(COUNTS)
    criterion = make_criterion(tiny_config(tmp_path, class_balance="weighted_loss"), class_weights=weights)
    per_image = -torch.log_softmax(logits, dim=1)[torch.arange(10), targets]
    hand = (weights[targets] * per_image).sum() / weights[targets].sum()
    assert criterion(logits, targets).item() == pytest.approx(hand.item(), rel=1e-6)
    assert criterion(logits, targets).item() != pytest.approx(per_image.mean().item(), rel=1e-3)  # it does weight


def test_the_engine_weights_its_criterion_by_the_training_split(tmp_path):
    state = train.prepare(tiny_config(tmp_path, class_balance="weighted_loss"), imbalanced_bundle(), verbose=False)
    torch.testing.assert_close(state.criterion.weight, class_balance.class_weights(COUNTS))
    plain = train.prepare(tiny_config(tmp_path), imbalanced_bundle(), verbose=False)
    assert plain.criterion.weight is None


def drawn_class_shares(labels, num_classes=3):
    counts = np.bincount(np.asarray(labels), minlength=num_classes)
    return counts / counts.sum()


def test_the_sampler_draws_every_class_equally_often():
    targets = np.repeat([0, 1, 2], [800, 150, 50])
    sampler = class_balance.ClassBalancedSampler(targets, 3, seed=0)
    drawn = []
    for epoch in range(10):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert len(order) == len(sampler) == 1000  # an epoch stays the split's length
        drawn += targets[order].tolist()
    # 10,000 draws: the standard error of each share is 0.005, so 0.03 is six of them
    assert drawn_class_shares(drawn) == pytest.approx([1 / 3] * 3, abs=0.03)
    assert drawn_class_shares(targets) == pytest.approx([0.8, 0.15, 0.05])  # without it: the split's own shares


def test_the_sampler_order_follows_seed_and_epoch_and_splits_across_ranks():
    targets = imbalanced_targets()
    ranks = [class_balance.ClassBalancedSampler(targets, 3, num_replicas=2, rank=rank, seed=3) for rank in (0, 1)]
    for sampler in ranks:
        sampler.set_epoch(1)
    whole = class_balance.balanced_order(class_balance.sample_weights(targets, 3), 64, seed=3, epoch=1)
    assert list(ranks[0]) == whole[0::2].tolist() and list(ranks[1]) == whole[1::2].tolist()
    assert list(ranks[0]) == list(ranks[0])  # the same epoch draws the same order
    first = list(ranks[0])
    ranks[0].set_epoch(2)
    assert list(ranks[0]) != first


def test_the_engine_draws_balanced_batches_through_the_dataloader(tmp_path):
    state = train.prepare(tiny_config(tmp_path, class_balance="sampler", batch_size=8), imbalanced_bundle(),
                          verbose=False)
    assert isinstance(state.sampler, class_balance.ClassBalancedSampler)
    labels = []
    for epoch in range(20):
        train.seed_epoch(state, epoch)
        labels += [label for _, targets in state.train_loader for label in targets.tolist()]
    assert len(labels) == 20 * 64
    assert drawn_class_shares(labels) == pytest.approx([1 / 3] * 3, abs=0.04)  # 1,280 draws: 3 standard errors


def test_storage_device_batches_draw_balanced_with_sample_weights(tmp_path):
    targets = torch.as_tensor(imbalanced_targets())
    split = ResidentSplit(torch.zeros(64, 3, 8, 8, dtype=torch.uint8), targets, CLASSES)
    batches = ResidentBatches(split, 8, "cpu", shuffle=True, drop_last=True, seed=0,
                              sample_weights=class_balance.sample_weights(split.targets, 3))
    labels = []
    for epoch in range(20):
        batches.set_epoch(epoch)
        labels += [label for _, chosen in batches for label in chosen.tolist()]
    assert len(labels) == 20 * 64
    assert drawn_class_shares(labels) == pytest.approx([1 / 3] * 3, abs=0.04)
    # and through the engine, storage=device's path
    bundle = DataBundle(split, None, None, CLASSES, "resident")
    state = train.prepare(tiny_config(tmp_path, class_balance="sampler", batch_size=8, image_size=8), bundle,
                          verbose=False)
    assert state.train_loader.sample_weights is not None


def test_fit_trains_with_each_correction(tmp_path):
    for choice in ("none", "weighted_loss", "sampler"):
        config = tiny_config(tmp_path, class_balance=choice, epochs=1, max_steps=2, output_dir=str(tmp_path / choice))
        result = train.fit(config, bundle=imbalanced_bundle(), progress=False, verbose=False)
        assert np.isfinite(result.final["train_loss"]) and "val_top1" in result.final


@pytest.mark.parametrize("values, message", [
    ({"class_balance": "focal"}, "class_balance='focal' is not one of none, weighted_loss, sampler"),
    ({"class_balance": "weighted_loss", "mixup_alpha": 0.2},
     "class_balance must be none or sampler with mixup_alpha or cutmix_alpha above 0, got 'weighted_loss'"),
    ({"class_balance": "sampler", "storage": "shards"}, "class_balance must be none with storage=shards, got 'sampler'"),
])
def test_bad_class_balance_values_are_refused_in_one_line(values, message):
    with pytest.raises(ConfigError) as error:
        make_config("smoke", **values)
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_a_dataset_without_labels_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="class_balance needs the training labels up front"):
        class_balance.training_targets(torch.utils.data.TensorDataset(torch.zeros(4, 3)))
