"""Image basics (`data.images`): 16-bit images scaled to 8 bits; data folders that cannot be used
(too few images to split, fewer than two classes, unreadable folders) refused in one line."""
import os

import numpy as np
import pytest
from PIL import Image

from course_lib.data import datasets, images


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


def _train_in_one_line(capsys, data_dir, tmp_path, *more):
    from course_lib import cli

    assert cli.main(["train", "--profile", "smoke", "-p", "dataset=imagefolder", "-p", f"data_dir={data_dir}",
                     "-p", f"output_dir={tmp_path / 'out'}", "--no-progress", *more]) == 2
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


def test_a_small_carve_out_with_val_present_does_not_advise_adding_val(tmp_path, capsys):
    """validation_from=train once advised "add a val/ folder" when val/ was there (issue 49)."""
    root = tmp_path / "data"
    _image_tree(root / "train", {"a": 3, "b": 3})
    _image_tree(root / "val", {"a": 2, "b": 2})
    error = _train_in_one_line(capsys, root, tmp_path, "-p", "validation_from=train")
    assert "(validation_from=train) has too few images" in error and "add a val/ folder" not in error
    assert "validate on the split you have (leave validation_from=train out)" in error


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


def test_the_suggested_chmod_is_shell_quoted():
    """Issue 49 point 10: a folder name with a space or a `;` made the advised command wrong, or another one."""
    import shlex

    from course_lib.data.images import _unreadable

    folder = "/data/my set; rm -rf ~"
    line = str(_unreadable(folder, PermissionError(13, "Permission denied")))
    assert f"chmod -R u+rX {shlex.quote(folder)})" in line and shlex.split(line.split("chmod ")[1].split(")")[0])[-1] == folder
