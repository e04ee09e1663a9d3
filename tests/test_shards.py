import numpy as np
import pytest
import torch
from PIL import Image

from course_lib.config import ConfigError, make_config
from course_lib.data import shards
from course_lib.data.datasets import ImageFolderDataset
from course_lib.data.images import BadImageError
from course_lib.data.landcover import make_landcover
from course_lib.data.loaders import make_loader


@pytest.fixture
def folder(tmp_path):
    return make_landcover(tmp_path / "set", image_size=32, per_class={"train": 3}) / "train"


def test_shards_round_trip_every_file_and_label_exactly(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=3)
    samples = ImageFolderDataset(folder).samples
    assert len(written.urls) == 3 and written.images == len(samples)
    seen = {}
    for key, extension, data, label in shards.read_samples(written.urls):
        seen[int(key)] = (extension, data, label)
    assert sorted(seen) == list(range(len(samples)))  # every file once
    for position, (path, label) in enumerate(samples):
        extension, data, stored_label = seen[position]
        assert extension == "jpg" and stored_label == label
        assert data == open(path, "rb").read()  # the encoded bytes, unchanged


def test_shards_mix_classes_so_buffer_shuffling_works(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    first_shard_labels = {label for _, _, _, label in shards.read_samples(written.urls[:1])}
    assert len(first_shard_labels) > 1


@pytest.mark.timeout(60)
def test_shard_loader_with_workers_decodes_every_image_once(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=4)
    dataset = shards.ShardDataset(written.urls, decoder="opencv")
    loader = make_loader(dataset, make_config("smoke", num_workers=2, batch_size=5), train=True, drop_last=False)
    images, labels = zip(*loader)
    images, labels = torch.cat(images), torch.cat(labels)
    reference = ImageFolderDataset(folder)
    assert len(labels) == len(reference)
    assert sorted(labels.tolist()) == sorted(reference.targets)
    expected = {tuple(np.array(Image.open(p).convert("RGB")).ravel()[:64]) for p, _ in reference.samples}
    assert {tuple(image.permute(1, 2, 0).numpy().ravel()[:64]) for image in images} == expected


@pytest.mark.timeout(60)
def test_corrupt_sample_fails_naming_shard_and_key_or_is_skipped(folder, tmp_path):
    (folder / "road" / "road_bad.jpg").write_bytes(b"broken")
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=1)
    with pytest.raises(BadImageError, match=r"shard-00000\.tar:\d+\.jpg"):
        list(shards.ShardDataset(written.urls))
    assert len(list(shards.ShardDataset(written.urls, bad_images="skip"))) == written.images - 1


def test_too_few_shards_for_ranks_times_workers_is_refused():
    with pytest.raises(ConfigError, match="DDP would hang"):
        shards.check_shard_count(7, ranks=2, workers_per_rank=4)
    assert shards.check_shard_count(16, ranks=2, workers_per_rank=4) == []
    assert "evenly" in shards.check_shard_count(12, ranks=2, workers_per_rank=4)[0]


@pytest.mark.parametrize("ranks,workers,total_bytes,expected", [
    (1, 1, 10, 1), (2, 4, 10, 8), (2, 4, 8 * 256 * 2**20 + 1, 16), (4, 8, 0, 32)])
def test_recommended_shard_count_is_a_multiple_of_readers(ranks, workers, total_bytes, expected):
    count = shards.recommend_shard_count(ranks, workers, total_bytes)
    assert count == expected and count % (ranks * workers) == 0


def test_shards_differ_by_at_most_one_image_and_none_is_empty(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=5)  # 24 images
    assert written.sizes == [4, 5, 5, 5, 5] and sum(written.sizes) == written.images == 24
    counted = [sum(1 for _ in shards.read_samples([url])) for url in written.urls]
    assert counted == written.sizes


def test_same_packing_is_reused_and_a_different_one_rewritten(folder, tmp_path):
    first = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    again = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    assert again.write_seconds == first.write_seconds and again.key == first.key
    other = shards.write_shards(folder, tmp_path / "shards", shard_count=3)
    assert other.key != first.key and len(other.urls) == 3
    assert sorted(p.name for p in (tmp_path / "shards").glob("*.tar")) == [f"shard-0000{i}.tar" for i in range(3)]


def test_decoder_check_leaves_unreadable_files_out_of_the_shards(folder, tmp_path):
    (folder / "road" / "road_bad.jpg").write_bytes(b"broken")
    with pytest.raises(BadImageError, match="road_bad.jpg"):
        shards.write_shards(folder, tmp_path / "fail", shard_count=2, decoder="pil")
    written = shards.write_shards(folder, tmp_path / "skip", shard_count=2, decoder="pil", bad_images="skip")
    assert written.images == 24 and [p.endswith("road_bad.jpg") for p in written.skipped] == [True]
    assert len(list(shards.ShardDataset(written.urls))) == 24


def test_unsized_shard_dataset_has_no_length_and_says_why(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    with pytest.raises(TypeError, match="shard_sizes"):
        len(shards.ShardDataset(written.urls))
    sized = shards.ShardDataset(written.urls, shard_sizes=written.sizes, batch_size=5)
    assert len(sized) == 20 and len(list(sized)) == 20  # 12 + 12 images, cut to whole batches of 5


def test_shuffled_stream_follows_torchs_seed_each_epoch(folder, tmp_path):
    written = shards.write_shards(folder, tmp_path / "shards", shard_count=3)
    stream = shards.ShardDataset(written.urls, shuffle_buffer=8, shard_sizes=written.sizes)

    def epoch(seed):
        torch.manual_seed(seed)  # what the engine does before each epoch
        return [label for _, label in stream]

    assert epoch(0) == epoch(0)  # a resumed run repeats the epoch
    assert epoch(1) != epoch(0) and sorted(epoch(1)) == sorted(epoch(0))


def test_a_truncated_or_missing_shard_is_named_with_the_fix_on_reuse(folder, tmp_path):
    from course_lib.data.build_lock import DamagedCacheError

    written = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    with open(written.urls[1], "r+b") as handle:
        handle.truncate(1024)
    with pytest.raises(DamagedCacheError, match=r"is damaged \(its shards hold .* bytes, not the .* shards.json "
                                                 r"recorded \(a shard cut short\?\)\); delete it \(rm -r .*\) and the "
                                                 "next run rebuilds it"):
        shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    (tmp_path / "shards" / "shard-00001.tar").unlink()
    with pytest.raises(DamagedCacheError, match="shard-00001.tar is missing"):
        shards.write_shards(folder, tmp_path / "shards", shard_count=2)


def test_a_shard_label_outside_the_classes_is_named_not_trained_on(folder, tmp_path):
    from pathlib import Path

    import webdataset as wds

    from course_lib.data.build_lock import DamagedCacheError

    path, _ = ImageFolderDataset(folder).samples[0]
    (tmp_path / "bad").mkdir()
    url = str(tmp_path / "bad" / "shard-00000.tar")
    with wds.TarWriter(url, encoder=False) as writer:
        writer.write({"__key__": "00000000", "jpg": Path(path).read_bytes(), "cls": b"99"})
    dataset = shards.ShardDataset([url], classes=[f"c{i}" for i in range(8)])
    with pytest.raises(DamagedCacheError, match=r"cache .*bad is damaged \(.*00000000.jpg has label b'99', not a "
                                                 r"class index below 8\); delete it"):
        list(dataset)


def test_an_image_replaced_in_place_rewrites_the_shards_and_says_so(folder, tmp_path, capsys):
    """Issue 49: shard sets were keyed by the files' paths, so an edited image kept its old bytes in the tar."""
    import os

    first = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    edited = sorted((folder / "water").iterdir())[0]
    Image.new("RGB", (32, 32), (255, 0, 0)).save(edited, quality=95)
    os.utime(edited, ns=(os.stat(edited).st_atime_ns, os.stat(edited).st_mtime_ns + 10**9))
    again = shards.write_shards(folder, tmp_path / "shards", shard_count=2)
    assert again.key != first.key and "tar shards" in capsys.readouterr().out
    index = [path for path, _ in ImageFolderDataset(folder).samples].index(str(edited))
    stored = {int(key): data for key, _, data, _ in shards.read_samples(again.urls)}
    assert stored[index] == edited.read_bytes()


def test_a_full_disk_while_packing_is_one_line_and_leaves_no_half_shard_set(folder, small_disk):
    """Issue 49 point 2: ENOSPC in the middle of a tar shard was a traceback and the partial folder stayed."""
    from conftest import fill_disk

    from course_lib.data.build_lock import DiskFullError

    fill_disk(small_disk)
    with pytest.raises(DiskFullError, match=r"no room on the disk for the tar shards: .* MiB needed .*storage=files"):
        shards.write_shards(folder, small_disk / "shards", shard_count=2)
    assert not list(small_disk.glob("shards.partial-*"))
