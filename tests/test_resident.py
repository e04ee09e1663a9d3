"""storage=device: a split as one uint8 tensor, batched by indexing, with no DataLoader."""
import pytest
import torch
from conftest import SAMPLE_DIR

from course_lib.config import ConfigError, make_config
from course_lib.data.resident import ResidentBatches, ResidentSplit


def _split(count=10, size=4):
    images = torch.arange(count, dtype=torch.uint8).view(count, 1, 1, 1).expand(count, 3, size, size).contiguous()
    return ResidentSplit(images, torch.arange(count) % 3, ["a", "b", "c"])


def test_each_epoch_is_a_permutation_fixed_by_seed_and_epoch():
    batches = ResidentBatches(_split(), 4, "cpu", shuffle=True, drop_last=True, seed=7)
    first = [int(i) for images, _ in batches for i in images[:, 0, 0, 0]]
    again = [int(i) for images, _ in batches for i in images[:, 0, 0, 0]]
    batches.set_epoch(1)
    other = [int(i) for images, _ in batches for i in images[:, 0, 0, 0]]
    assert len(batches) == 2 and len(first) == 8 and len(set(first)) == 8  # drop_last: 10 images, 2 full batches
    assert first == again and first != other


def test_ranks_take_disjoint_equal_shares_and_evaluation_keeps_every_image():
    shares = [[int(i) for images, _ in ResidentBatches(_split(), 2, "cpu", shuffle=True, drop_last=True, rank=r,
                                                       world_size=3) for i in images[:, 0, 0, 0]] for r in range(3)]
    assert all(len(share) == 2 for share in shares)  # 9 of 10 images in 3 shares of 3, 1 full batch of 2 each
    assert not set(shares[0]) & set(shares[1]) and not set(shares[1]) & set(shares[2])
    evaluation = ResidentBatches(_split(), 4, "cpu", shuffle=False, drop_last=False)
    assert len(evaluation) == 3 and [int(t) for _, targets in evaluation for t in targets] == [i % 3 for i in range(10)]


def test_labels_travel_with_their_images():
    for images, targets in ResidentBatches(_split(), 3, "cpu", shuffle=True, drop_last=False, seed=1):
        assert torch.equal(images[:, 0, 0, 0].long() % 3, targets)


def test_a_cached_split_becomes_one_tensor_with_the_same_pixels(tmp_path):
    from course_lib.data import cache
    from course_lib.data.datasets import TransformedSubset

    info = cache.build_cache(SAMPLE_DIR / "val", 16, tmp_path / "cache")
    whole = cache.PreDecodedDataset(info.folder)
    resident = ResidentSplit.from_dataset(whole, whole.classes)
    assert resident.images.shape == (len(whole), 3, 16, 16) and resident.images.dtype == torch.uint8
    assert torch.equal(resident.images[5], whole[5][0]) and resident.targets[5] == whole[5][1]
    part = ResidentSplit.from_dataset(TransformedSubset(whole, [9, 2, 4]), whole.classes)
    assert torch.equal(part.images[0], whole[9][0]) and part.targets == [whole[i][1] for i in (9, 2, 4)]


def test_storage_device_trains_and_refuses_per_image_augmentation(tmp_path):
    from course_lib.data.pipeline import image_folder_bundle
    from course_lib.engine import train

    with pytest.raises(ConfigError, match="storage=device .* augmentation=device"):
        image_folder_bundle(SAMPLE_DIR, make_config("smoke", storage="device", augmentation="cpu"))
    config = make_config("smoke", storage="device", augmentation="device", epochs=2, max_steps=3,
                         output_dir=str(tmp_path / "ck"))
    result = train.fit(config, progress=False, verbose=False)
    assert [row["optimizer_steps"] for row in result.history] == [3, 3]
    assert 0.0 <= result.history[-1]["val_top1"] <= 1.0
