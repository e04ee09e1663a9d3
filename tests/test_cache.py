import numpy as np
import pytest
import torch
from PIL import Image

from course_lib.config import make_config
from course_lib.data import cache
from course_lib.data.datasets import ImageFolderDataset
from course_lib.data.images import BadImageError
from course_lib.data.landcover import make_landcover
from course_lib.data.loaders import make_loader


@pytest.fixture
def folder(tmp_path):
    return make_landcover(tmp_path / "set", image_size=32, per_class={"train": 3}) / "train"


def test_cache_round_trips_every_image_and_label_exactly(folder, tmp_path):
    info = cache.build_cache(folder, 32, tmp_path / "cache")
    dataset = cache.PreDecodedDataset(info.folder)
    reference = ImageFolderDataset(folder)
    assert len(dataset) == len(reference) == info.images == 24
    assert dataset.classes == reference.classes
    for index, (path, label) in enumerate(reference.samples):
        image, cached_label = dataset[index]
        assert cached_label == label
        assert torch.equal(image, torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1))
    assert info.pixel_bytes == 24 * 32 * 32 * 3
    assert info.disk_ratio > 1  # raw pixels take more disk than JPEG: the price of the speed-up


def test_cache_is_reused_and_resizes_to_the_requested_size(folder, tmp_path):
    first = cache.build_cache(folder, 16, tmp_path / "cache")
    again = cache.build_cache(folder, 16, tmp_path / "cache")
    assert again.build_seconds == first.build_seconds  # read back, not rebuilt
    assert cache.PreDecodedDataset(first.folder)[0][0].shape == (3, 16, 16)


@pytest.mark.timeout(60)
def test_cache_serves_workers_through_a_lazily_opened_memmap(folder, tmp_path):
    dataset = cache.PreDecodedDataset(cache.build_cache(folder, 32, tmp_path / "cache").folder)
    loader = make_loader(dataset, make_config("smoke", num_workers=1, batch_size=8), train=False)
    images = torch.cat([batch for batch, _ in loader])
    assert images.shape == (24, 3, 32, 32) and images.dtype == torch.uint8
    import pickle

    dataset[0]  # opens the memmap in this process
    assert len(pickle.dumps(dataset)) < 10_000  # what a worker receives: the path, not the pixels


@pytest.mark.timeout(60)
def test_bad_file_fails_naming_it_or_is_left_out(folder, tmp_path):
    (folder / "water" / "water_bad.jpg").write_bytes(b"not an image")
    with pytest.raises(BadImageError, match="water_bad.jpg"):
        cache.build_cache(folder, 32, tmp_path / "fail", num_workers=1)
    assert not (tmp_path / "fail").exists()
    info = cache.build_cache(folder, 32, tmp_path / "skip", bad_images="skip", num_workers=1)
    assert info.images == 24 and [p.endswith("water_bad.jpg") for p in info.skipped] == [True]
    assert len(cache.PreDecodedDataset(info.folder)) == 24


def test_missing_cache_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="build_cache"):
        cache.PreDecodedDataset(tmp_path)


def test_cache_of_chosen_files_keeps_their_order(folder, tmp_path):
    reference = ImageFolderDataset(folder)
    info = cache.build_cache(folder, 32, tmp_path / "cache", indices=[20, 3, 7])
    dataset = cache.PreDecodedDataset(info.folder)
    assert info.images == 3 and dataset.targets == [reference.targets[i] for i in (20, 3, 7)]
    expected = torch.from_numpy(np.array(Image.open(reference.samples[3][0]).convert("RGB"))).permute(2, 0, 1)
    assert torch.equal(dataset[1][0], expected)


def test_selection_key_changes_with_the_file_list(folder):
    listing = ImageFolderDataset(folder)
    key = cache.selection_key(listing, range(len(listing)), "pil")
    assert key == cache.selection_key(ImageFolderDataset(folder), range(len(listing)), "pil")
    assert key != cache.selection_key(listing, range(len(listing)), "opencv")
    assert key != cache.selection_key(listing, range(len(listing) - 1), "pil")
    (folder / "water" / "water_new.jpg").write_bytes((folder / "water").glob("*.jpg").__next__().read_bytes())
    grown = ImageFolderDataset(folder)
    assert cache.selection_key(grown, range(len(grown)), "pil") != key


def test_minus_one_workers_build_with_the_recommended_number(folder, tmp_path):
    info = cache.build_cache(folder, 16, tmp_path / "cache", num_workers=-1)
    assert info.images == 24


@pytest.mark.parametrize("damage, what", [
    ("truncate pixels", "images.uint8 holds 1,000 bytes, not the 18,432 of 24 images at 16 px"),
    ("truncate labels", "labels.npy is unreadable"),
    ("label out of range", "a label is outside 0..7, the 8 classes"),
    ("truncate index", "cache.json is unreadable"),
])
def test_a_damaged_cache_is_named_with_the_fix_on_reuse(folder, tmp_path, damage, what):
    from course_lib.data.build_lock import DamagedCacheError

    info = cache.build_cache(folder, 16, tmp_path / "cache")
    if damage == "truncate pixels":
        with open(info.folder / cache.PIXELS_FILE, "r+b") as handle:
            handle.truncate(1000)
    elif damage == "truncate labels":
        data = (info.folder / cache.LABELS_FILE).read_bytes()
        (info.folder / cache.LABELS_FILE).write_bytes(data[: len(data) // 2])
    elif damage == "label out of range":
        labels = np.load(info.folder / cache.LABELS_FILE)
        labels[3] = 8
        np.save(info.folder / cache.LABELS_FILE, labels)
    else:
        text = (info.folder / cache.META_FILE).read_text()
        (info.folder / cache.META_FILE).write_text(text[: len(text) // 2])
    for reuse in (lambda: cache.build_cache(folder, 16, tmp_path / "cache"),
                  lambda: cache.PreDecodedDataset(info.folder)):
        with pytest.raises(DamagedCacheError) as refused:
            reuse()
        message = str(refused.value)
        assert message.startswith(f"cache {info.folder} is damaged (") and what in message, message
        assert message.endswith("and the next run rebuilds it") and "\n" not in message
    import shutil

    shutil.rmtree(info.folder)  # the fix the message gives
    assert cache.build_cache(folder, 16, tmp_path / "cache").images == 24


def _solid(path, colour):
    Image.new("RGB", (32, 32), colour).save(path, quality=95)


def test_an_image_edited_in_place_rebuilds_the_cache_and_says_so(folder, tmp_path, capsys):
    """Issue 49: the cache was keyed by the files' paths, so images edited in place trained on the old pixels."""
    import os

    first = cache.build_cache(folder, 32, tmp_path / "cache")
    edited = sorted((folder / "forest").iterdir())[0]
    _solid(edited, (255, 0, 0))
    os.utime(edited, ns=(os.stat(edited).st_atime_ns, os.stat(edited).st_mtime_ns + 10**9))  # a later date
    again = cache.build_cache(folder, 32, tmp_path / "cache")
    assert "pre-decoded cache" in capsys.readouterr().out and again.content_key != first.content_key
    row = [path for path, _ in ImageFolderDataset(folder).samples].index(str(edited))
    red = cache.PreDecodedDataset(again.folder)[row][0].float().mean(dim=(1, 2))
    assert red[0] > 200 and red[1] < 60  # the new, red pixels
    assert cache.build_cache(folder, 32, tmp_path / "cache").build_seconds == again.build_seconds  # reused now
    assert capsys.readouterr().out == ""


def test_swapped_class_folders_rebuild_the_cache_with_the_new_labels(folder, tmp_path, capsys):
    first = cache.build_cache(folder, 32, tmp_path / "cache")
    (folder / "forest").rename(folder / "swap")
    (folder / "water").rename(folder / "forest")
    (folder / "swap").rename(folder / "water")
    again = cache.build_cache(folder, 32, tmp_path / "cache")
    assert again.content_key != first.content_key and "rebuilding" in capsys.readouterr().out
    reference = ImageFolderDataset(folder)
    assert cache.PreDecodedDataset(again.folder).targets == [label for _, label in reference.samples]


def test_a_cache_built_before_the_content_key_is_rebuilt_once(folder, tmp_path, capsys):
    import json

    info = cache.build_cache(folder, 32, tmp_path / "cache")
    meta = json.loads((info.folder / cache.META_FILE).read_text())
    del meta["content_key"]  # as an older workbook wrote it
    (info.folder / cache.META_FILE).write_text(json.dumps(meta))
    cache.build_cache(folder, 32, tmp_path / "cache")
    assert "built before its key covered" in capsys.readouterr().out


def test_a_cache_larger_than_the_disk_is_one_line_and_leaves_nothing_behind(folder, small_disk):
    """Issue 49 point 2: the pixels' memmap was a sparse file, so a disk that filled halfway through the build
    killed the process with SIGBUS (exit 135), no message, a partial folder left filling the disk. The blocks
    are now reserved first: 24 images at 512 px need 18 MiB of an 8 MiB disk."""
    from course_lib.data.build_lock import DiskFullError

    with pytest.raises(DiskFullError, match=r"no room on the disk for the pre-decoded cache's pixels: 18\.0 MiB "
                                            r"needed at .*MiB free there; free some space, or train with storage=files"):
        cache.build_cache(folder, 512, small_disk / "cache")
    assert sorted(path.name for path in small_disk.iterdir()) == ["cache.lock"]  # no partial


def test_the_partials_of_builds_whose_process_is_gone_are_removed_and_links_never_followed(folder, tmp_path):
    """Issue 49 points 2 and 12: a killed build's `<cache>.partial-<pid>` stayed for good; one of a live process
    is left alone, and a planted link of that name is removed as a link, its target untouched."""
    import os

    dead = tmp_path / "cache.partial-999999999"  # above any pid_max: no such process
    dead.mkdir()
    (dead / cache.PIXELS_FILE).write_bytes(bytes(4096))
    alive = tmp_path / f"cache.partial-{os.getppid()}"
    alive.mkdir()
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "keep.txt").write_text("mine")
    planted = tmp_path / "cache.partial-999999998"
    planted.symlink_to(precious, target_is_directory=True)
    cache.build_cache(folder, 32, tmp_path / "cache")
    assert not dead.exists() and not planted.is_symlink() and alive.is_dir()
    assert (precious / "keep.txt").read_text() == "mine"
    assert not list(tmp_path.glob(f"cache.partial-{os.getpid()}"))  # its own staging became the cache
