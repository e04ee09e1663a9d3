"""The dataset classes (`data.datasets`): unreadable images failed or skipped, the sample grid, folder
links."""
import os

import numpy as np
import pytest
from PIL import Image

from course_lib.config import make_config
from course_lib.data import datasets, images, pipeline
from course_lib.data.landcover import make_landcover


def test_bad_image_fail_and_skip(tmp_path):
    folder = tmp_path / "x"
    folder.mkdir()
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(folder / "good.png")
    (folder / "bad.jpg").write_bytes(b"not a jpeg")
    failing = datasets.ImageFolderDataset(tmp_path, None, "fail")
    bad_index = [p for p, _ in failing.samples].index(str(folder / "bad.jpg"))
    with pytest.raises(images.BadImageError, match="bad.jpg.*bad_images=skip"):
        failing[bad_index]
    skipping = datasets.ImageFolderDataset(tmp_path, None, "skip")
    image, _ = skipping[bad_index]
    assert image.size == (8, 8) and skipping.skipped == {str(folder / "bad.jpg")}


def test_sample_grid_draws_every_class():
    bundle = pipeline.build_datasets(make_config("smoke"))
    figure = datasets.sample_grid(bundle.val, bundle.classes, per_class=2)
    assert len(figure.axes) == 2 * len(bundle.classes)


def _save(path, seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(path)


@pytest.fixture
def linked_classes(tmp_path):
    root = tmp_path / "dataset"
    for index in range(3):
        _save(root / "cat" / f"{index}.png", index)
        _save(root / "dog" / f"{index}.png", 10 + index)
    (root / "cat" / "dogs").symlink_to(root / "dog")  # another class's images, labelled cat if followed
    return root


def test_a_folder_link_in_a_class_folder_is_not_followed(linked_classes, caplog):
    dataset = datasets.ImageFolderDataset(linked_classes)
    cat = dataset.classes.index("cat")
    assert len(dataset) == 6 and [target for _, target in dataset.samples].count(cat) == 3
    assert not any("/cat/dogs/" in path for path, _ in dataset.samples)  # torchvision's ImageFolder has 3 of them
    assert "not following the folder link" in caplog.text and "dogs" in caplog.text


def test_follow_links_follows_them_once_even_a_link_to_an_ancestor(linked_classes):
    (linked_classes / "cat" / "ring").symlink_to(linked_classes)  # os.walk(followlinks=True) never ends here
    dataset = datasets.ImageFolderDataset(linked_classes, follow_links=True)
    cat = dataset.classes.index("cat")
    labelled_cat = [path for path, target in dataset.samples if target == cat]
    dog_folder = os.path.realpath(linked_classes / "dog")
    assert len(labelled_cat) == 3 + 3  # through cat/dogs or cat/ring/dog, whichever comes first: once
    assert sum(os.path.dirname(os.path.realpath(path)) == dog_folder for path in labelled_cat) == 3


def test_a_broken_link_fails_in_one_line_or_is_left_out_with_skip(linked_classes, tmp_path):
    broken = linked_classes / "dog" / "gone.png"
    broken.symlink_to(tmp_path / "deleted.png")
    with pytest.raises(images.BadImageError) as error:
        datasets.ImageFolderDataset(linked_classes)
    message = str(error.value)
    assert message.startswith(f"{broken}: symbolic link to ") and "\n" not in message
    assert len(datasets.ImageFolderDataset(linked_classes, bad_images="skip")) == 6


# --- issue 30 point 8: a FIFO named like an image -------------------------------------------------

@pytest.fixture
def small_landcover(tmp_path):
    return make_landcover(tmp_path / "lc", image_size=16, per_class={"train": 2, "val": 1, "test": 1})


def test_a_fifo_named_like_an_image_is_one_line_not_a_hang(small_landcover):
    fifo = small_landcover / "train" / "forest" / "pipe.jpg"
    os.mkfifo(fifo)
    with pytest.raises(images.BadImageError, match=r"pipe\.jpg: not a regular file \(a FIFO\)"):
        datasets.ImageFolderDataset(small_landcover / "train")
    skipping = datasets.ImageFolderDataset(small_landcover / "train", bad_images="skip")
    assert str(fifo) not in [path for path, _ in skipping.samples]


def test_max_train_images_never_leaves_a_class_out(tmp_path):
    """Issue 49 point 8: a 200/2 split with 10 kept lost the small class, silently."""
    targets = [0] * 200 + [1] * 2
    plain = datasets.limit_indices(len(targets), 10, seed=0)
    assert {targets[i] for i in plain} == {0}  # the seeded random pick alone misses class 1
    kept = datasets.limit_indices(len(targets), 10, seed=0, targets=targets)
    assert len(kept) == 10 and len(set(kept)) == 10 and {targets[i] for i in kept} == {0, 1}
    assert kept == datasets.limit_indices(len(targets), 10, seed=0, targets=targets)  # seeded
    balanced = [0, 1] * 100  # a pick that holds every class is the same as before
    assert datasets.limit_indices(200, 10, seed=3, targets=balanced) == datasets.limit_indices(200, 10, seed=3)
    with pytest.raises(datasets.DataFolderError, match=r"max_train_images=1 cannot keep one image of each of the "
                                                       r"2 classes; set it to 2 or more"):
        datasets.limit_indices(len(targets), 1, seed=0, targets=targets)
    # through the pipeline: a folder whose second class has 2 images keeps it
    root = tmp_path / "data"
    for split, counts in (("train", {"big": 40, "small": 2}), ("val", {"big": 2, "small": 2})):
        for name, count in counts.items():
            (root / split / name).mkdir(parents=True)
            for index in range(count):
                Image.new("RGB", (8, 8), (index, 0, 0)).save(root / split / name / f"{index}.png")
    listing = pipeline.FolderListings(make_config("smoke", dataset="imagefolder", data_dir=str(root)))
    plans = pipeline.plan_splits(root, 0, 5, listing)
    train = listing(plans["train"].folder)
    assert sorted({train.targets[i] for i in plans["train"].indices}) == [0, 1]
