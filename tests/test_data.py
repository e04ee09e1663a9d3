import os
import pickle

import numpy as np
import pytest
import torch
from conftest import SAMPLE_DIR
from PIL import Image

from course_lib.config import ConfigError, make_config
from course_lib.data import datasets, images, landcover, pipeline


def test_generator_is_deterministic_and_sized():
    a = landcover.landcover_image("forest", 3, size=48, seed=1)
    b = landcover.landcover_image("forest", 3, size=48, seed=1)
    c = landcover.landcover_image("forest", 4, size=48, seed=1)
    assert a.shape == (48, 48, 3) and a.dtype == np.uint8
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_confusable_pairs_are_closer_than_other_pairs():
    """Mean colour of each class over a few images: each confusable pair is nearer than the
    average distance between classes, so a confusion matrix has structure to find."""
    means = {name: np.mean([landcover.landcover_image(name, i, 32).reshape(-1, 3).mean(0) for i in range(12)], 0)
             for name in landcover.LANDCOVER_CLASSES}
    names = list(means)
    distances = [np.linalg.norm(means[a] - means[b]) for i, a in enumerate(names) for b in names[i + 1:]]
    for a, b in landcover.LANDCOVER_CONFUSABLE:
        assert np.linalg.norm(means[a] - means[b]) < np.mean(distances)


def test_make_landcover_layout(tmp_path):
    out = landcover.make_landcover(tmp_path / "lc", image_size=40, per_class={"train": 2, "val": 1, "test": 1}, seed=3)
    for split, count in (("train", 2), ("val", 1), ("test", 1)):
        for name in landcover.LANDCOVER_CLASSES:
            files = sorted((out / split / name).glob("*.jpg"))
            assert len(files) == count
            with Image.open(files[0]) as image:
                assert image.size == (40, 40) and image.format == "JPEG"
    assert not (tmp_path / "lc.partial").exists()
    with pytest.raises(FileExistsError, match="already exists"):
        landcover.make_landcover(out, image_size=40)
    with pytest.raises(ConfigError, match="16..1024"):
        landcover.make_landcover(tmp_path / "big", image_size=2048)


def test_committed_sample_is_small_and_complete():
    files = list(SAMPLE_DIR.rglob("*.jpg"))
    assert sum(f.stat().st_size for f in files) <= 2 * 1024 * 1024
    assert {f.parent.name for f in files} == set(landcover.LANDCOVER_CLASSES)
    assert {f.parents[1].name for f in files} == set(datasets.SPLITS)


def test_smoke_bundle_from_sample():
    bundle = pipeline.build_datasets(make_config("smoke"))
    image, label = bundle.train[0]
    assert image.shape == (3, 32, 32) and image.dtype == torch.float32
    assert bundle.classes == list(landcover.LANDCOVER_CLASSES)
    assert len(bundle.train) == 256 and len(bundle.val) == 80 and len(bundle.test) == 80


def test_digits_bundle_is_stratified():
    bundle = pipeline.build_datasets(make_config("smoke", dataset="digits", max_train_images=0))
    assert len(bundle.train) + len(bundle.val) + len(bundle.test) == 1797
    assert bundle.classes == [str(d) for d in range(10)]
    assert set(bundle.val.targets) == set(range(10))
    assert bundle.train[0][0].shape == (3, 32, 32)


def test_imagefolder_needs_data_dir():
    with pytest.raises(ConfigError, match="data_dir"):
        pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=""))


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(tmp_path / "nope")))


def test_imagefolder_without_splits_is_split(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(10):
            Image.fromarray(np.full((8, 8, 3), i * 20, np.uint8)).save(tmp_path / name / f"{i}.png")
    bundle = pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(tmp_path),
                                             max_train_images=0))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (16, 2, 2)
    assert bundle.classes == ["a", "b"]


def _fake_eurosat(root, per_class=3):
    folder = root / "eurosat" / "2750"
    for name in ("AnnualCrop", "Forest", "River"):
        (folder / name).mkdir(parents=True)
        for i in range(per_class * 4):
            Image.fromarray(np.full((64, 64, 3), i, np.uint8)).save(folder / name / f"{name}_{i}.jpg")


def test_torchvision_eurosat_on_a_fake_copy(tmp_path):
    _fake_eurosat(tmp_path)
    bundle = pipeline.build_datasets(make_config("smoke", dataset="eurosat", data_dir=str(tmp_path), max_train_images=0))
    assert bundle.classes == ["AnnualCrop", "Forest", "River"]
    assert len(bundle.train) + len(bundle.val) + len(bundle.test) == 36
    assert bundle.train[0][0].shape == (3, 32, 32)


def test_torchvision_eurosat_missing_says_how_to_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="download=true"):
        pipeline.build_datasets(make_config("smoke", dataset="eurosat", data_dir=str(tmp_path)))


def test_torchvision_cifar10_on_a_fake_copy(tmp_path, monkeypatch):
    import torchvision.datasets.cifar as cifar

    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    rng = np.random.default_rng(0)

    def batch(count):
        return {"data": rng.integers(0, 255, (count, 3072), dtype=np.uint8), "labels": [i % 10 for i in range(count)]}

    for name in [f"data_batch_{i}" for i in range(1, 6)]:
        pickle.dump(batch(20), open(folder / name, "wb"))
    pickle.dump(batch(20), open(folder / "test_batch", "wb"))
    pickle.dump({"label_names": [f"class{i}" for i in range(10)]}, open(folder / "batches.meta", "wb"))
    # The fake files cannot match CIFAR-10's published md5 sums; everything else is torchvision's code.
    monkeypatch.setattr(cifar, "check_integrity", lambda path, md5=None: True)
    bundle = pipeline.build_datasets(make_config("smoke", dataset="cifar10", data_dir=str(tmp_path), max_train_images=0))
    assert len(bundle.train) == 90 and len(bundle.val) == 10 and len(bundle.test) == 20
    assert bundle.classes[0] == "class0"
    assert bundle.train[0][0].shape == (3, 32, 32)


def test_real_eurosat_folder_loads(eurosat_dir):
    bundle = pipeline.build_datasets(make_config("smoke", dataset="imagefolder", data_dir=str(eurosat_dir)))
    assert bundle.num_classes == 10 and len(bundle.val) == 4050
    image, label = bundle.val[0]
    assert image.shape == (3, 32, 32) and label == 0


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


# --- what loads is what `workbook scan` reports (links, 16-bit images) ----------------------------------

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


def test_a_16_bit_png_loads_scaled_to_8_bits_not_clipped_white(tmp_path):
    path = tmp_path / "depth.png"
    values = np.array([[0, 257, 32896, 65535]], dtype=np.uint16)
    Image.fromarray(values).save(path)
    assert np.asarray(images.load_rgb(path))[0, :, :].tolist() == [[0] * 3, [1] * 3, [128] * 3, [255] * 3]
    gradient = np.linspace(0, 65535, 64 * 64).astype(np.uint16).reshape(64, 64)
    Image.fromarray(gradient).save(path)
    loaded = np.asarray(images.load_rgb(path)).astype(int)
    assert (loaded == 255).mean() < 0.01  # PIL's convert("RGB") makes over 99% of them white
    assert np.abs(loaded[..., 0] - np.round(gradient / 257)).max() == 0


def _image_tree(root, counts):
    """root/<class>/<i>.png, `counts[class]` tiny images per class."""
    for name, count in counts.items():
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.fromarray(np.full((8, 8, 3), i * 7 % 256, np.uint8)).save(root / name / f"{i}.png")
    return root


def _train_in_one_line(capsys, data_dir, tmp_path):
    from course_lib import cli

    assert cli.main(["train", "--profile", "smoke", "-p", "dataset=imagefolder", "-p", f"data_dir={data_dir}",
                     "-p", f"output_dir={tmp_path / 'out'}", "--no-progress"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "Traceback" not in error, error
    assert not (tmp_path / "out" / "last.pt").exists()
    return error


def test_a_small_train_folder_without_val_is_one_line_not_a_stratify_traceback(tmp_path, capsys):
    root = tmp_path / "data"
    _image_tree(root / "train", {"a": 3, "b": 3})
    error = _train_in_one_line(capsys, root, tmp_path)
    assert f"{root / 'train'} (with no val/ beside it) has too few images to split by class into 2 parts " \
           "(6 images, 2 classes, the smallest with 3); add a val/ folder beside train/" in error
    with pytest.raises(images.DataFolderError, match=r"a class with 1 image|the smallest with 1"):
        datasets.split_indices([0, 0, 0, 1], (0.5, 0.5), 0, "a class with 1 image")


def test_fewer_than_two_classes_are_refused_in_one_line(tmp_path, capsys):
    root = tmp_path / "data"
    _image_tree(root / "train", {"forest": 20})
    _image_tree(root / "val", {"forest": 4})
    error = _train_in_one_line(capsys, root, tmp_path)
    assert f"{root / 'train'} has 1 class folder(s) (forest); a classifier needs at least 2" in error


def test_unreadable_split_and_class_folders_are_one_line_naming_the_folder(tmp_path, capsys, monkeypatch):
    root = tmp_path / "data"
    _image_tree(root / "train", {"a": 20, "b": 20})
    _image_tree(root / "val", {"a": 4, "b": 4})
    real_scandir = os.scandir

    def scandir_refusing(blocked):
        def scandir(path="."):  # as root, chmod 000 would not stop the read: refuse it here
            if os.fspath(path) == os.fspath(blocked):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_scandir(path)
        return scandir

    for blocked in (root / "val", root / "train" / "b"):
        monkeypatch.setattr(os, "scandir", scandir_refusing(blocked))
        error = _train_in_one_line(capsys, root, tmp_path)
        assert f"cannot read the folder {blocked} (Permission denied); fix its permissions" in error
        assert "no image files" not in error
