import errno
import io
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from course_lib import cli
from course_lib.data import scan


@pytest.fixture
def messy_folder(tmp_path):
    good = Image.fromarray(np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8))
    good.save(tmp_path / "good.jpg")
    buffer = io.BytesIO()
    good.save(buffer, format="JPEG")
    (tmp_path / "truncated.jpg").write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    (tmp_path / "empty.jpg").write_bytes(b"")
    (tmp_path / "garbage.jpg").write_bytes(b"this is not an image at all")
    good.save(tmp_path / "actually_png.jpg", format="PNG")
    good.convert("CMYK").save(tmp_path / "cmyk.jpg")
    (tmp_path / "notes.bin").write_bytes(b"\x00\x01")
    return tmp_path


def test_scan_reports_each_problem_kind(messy_folder):
    checked, problems = scan.scan_folder(messy_folder)
    kinds = {p.path.split("/")[-1]: p.kind for p in problems}
    assert checked == 7
    assert kinds == {"truncated.jpg": "truncated", "empty.jpg": "zero-byte", "garbage.jpg": "unreadable",
                     "actually_png.jpg": "wrong-extension", "cmyk.jpg": "unusual-mode", "notes.bin": "not-an-image"}


def test_scan_cli_exit_codes(messy_folder, tmp_path_factory, capsys):
    assert cli.main(["scan", str(messy_folder)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert any(line.startswith(str(messy_folder / "empty.jpg")) and "zero-byte" in line for line in lines)
    assert lines[-1] == "checked 7 files: 6 problem(s)"
    clean = tmp_path_factory.mktemp("clean")
    Image.fromarray(np.zeros((8, 8, 3), np.uint8)).save(clean / "ok.png")
    assert cli.main(["scan", str(clean)]) == 0


def test_scan_missing_folder_is_one_line(tmp_path, capsys):
    assert cli.main(["scan", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "is not a folder" in err and len(err.strip().splitlines()) == 1


def test_data_make_cli(tmp_path, capsys):
    out = tmp_path / "lc"
    assert cli.main(["data", "make", "--out", str(out), "--image-size", "24", "--train", "1", "--val", "1",
                     "--test", "0"]) == 0
    assert "wrote 16 images" in capsys.readouterr().out
    assert cli.main(["data", "make", "--out", str(out)]) == 2


# --- links: scan reports what the loader would follow ------------------------------------------------

def save_image(path, size=(32, 32), seed=0):
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return path


@pytest.fixture
def linked_folder(tmp_path):
    root = tmp_path / "dataset"
    for index in range(3):
        save_image(root / "cat" / f"{index}.png", seed=index)
        save_image(root / "dog" / f"{index}.png", seed=10 + index)
    elsewhere = tmp_path / "elsewhere"
    for index in range(4):
        save_image(elsewhere / f"{index}.png", seed=20 + index)
    cat = root / "cat"
    (cat / "broken.png").symlink_to(tmp_path / "deleted.png")
    (cat / "self.png").symlink_to(cat / "self.png")
    (cat / "ring").symlink_to(root)  # a folder that contains the link: os.walk(followlinks=True) never ends
    (cat / "dogs").symlink_to(root / "dog")  # another class's images, labelled cat by the loader
    (cat / "more").symlink_to(elsewhere)
    (cat / "far.png").symlink_to(elsewhere / "0.png")
    (cat / "near.png").symlink_to(cat / "0.png")  # a file link inside the dataset: fine
    return root


def test_scan_reports_every_kind_of_link(linked_folder):
    checked, problems = scan.scan_folder(linked_folder)
    kinds = {p.path.split("/")[-1]: p.kind for p in problems}
    assert kinds == {"broken.png": "broken-link", "self.png": "looping-link", "ring": "looping-link",
                     "dogs": "directory-link", "more": "directory-link", "far.png": "outside-link"}
    details = {p.path.split("/")[-1]: p.detail for p in problems}
    assert "holding 3 image file(s)" in details["dogs"] and "inside the dataset" in details["dogs"]
    assert "holding 4 image file(s)" in details["more"] and "outside the dataset" in details["more"]
    assert checked == 6 + 2  # the real files, then far.png and near.png scanned through their links


def test_the_loader_follows_a_folder_link_that_scan_reports(linked_folder):
    """The fault scan now reports: torchvision's ImageFolder labels another class's images as cat."""
    from torchvision.datasets import ImageFolder

    for name in ("broken.png", "self.png", "ring"):
        (linked_folder / "cat" / name).unlink()  # what the loader cannot survive at all
    dataset = ImageFolder(str(linked_folder))
    cat = dataset.class_to_idx["cat"]
    dog_images_labelled_cat = [p for p, label in dataset.samples if label == cat and "/cat/dogs/" in p]
    assert len(dog_images_labelled_cat) == 3
    _, problems = scan.scan_folder(linked_folder)
    assert {p.kind for p in problems} == {"directory-link", "outside-link"}


def test_follow_links_scans_linked_folders_once(linked_folder):
    save_image(linked_folder.parent / "elsewhere" / "broken.png").write_bytes(b"")
    checked, problems = scan.scan_folder(linked_folder, follow_links=True)
    assert checked == 8 + 3 + 5  # plus the dog folder again and the five files elsewhere
    assert any(p.kind == "zero-byte" and p.path.endswith("elsewhere/broken.png") for p in problems)
    assert cli.main(["scan", str(linked_folder)]) == 1


# --- suspect images: 16-bit, decompression bombs, tiny and odd sizes -----------------------------------

def test_a_16_bit_image_is_reported_with_what_the_loader_does_to_it(tmp_path):
    path = tmp_path / "depth.png"
    gradient = np.linspace(0, 65535, 64 * 64).astype(np.uint16).reshape(64, 64)
    Image.fromarray(gradient).save(path)
    with Image.open(path) as image:
        assert image.mode in ("I;16", "I")
        clipped = np.asarray(image.convert("RGB"))
    assert (clipped == 255).mean() > 0.99  # the fault: almost every pixel turns white
    problems = scan.scan_file(path)
    assert [p.kind for p in problems] == ["high-bit-depth"]
    # the loader scales it (images.to_rgb), so the message says so, not that it turns white
    assert "scale 16-bit values to 8 bits (round(v / 257)" in problems[0].detail and "white" not in problems[0].detail


def test_a_file_name_with_a_newline_cannot_forge_a_scan_line(tmp_path, capsys):
    from course_lib import cli

    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / split / label).mkdir(parents=True)
            Image.new("RGB", (16, 16)).save(tmp_path / split / label / "fine.png")
    (tmp_path / "train" / "a" / "x.png\nok.png: zero-byte: forged").write_bytes(b"")
    assert cli.main(["scan", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[-1] == "checked 5 files: 1 problem(s)", lines
    assert "x.png\\nok.png: zero-byte: forged: zero-byte:" in lines[0]


def test_a_decompression_bomb_is_judged_from_its_header_without_decoding(tmp_path, monkeypatch):
    path = tmp_path / "bomb.png"
    Image.new("L", (9500, 9500)).save(path, compress_level=9)  # about 90 megapixels
    assert path.stat().st_size < 200_000

    def no_decoding(self):
        raise AssertionError("scan decoded the bomb")

    monkeypatch.setattr(Image.Image, "load", no_decoding)
    (problem,) = scan.scan_file(path)
    assert problem.kind == "decompression-bomb" and "9500x9500 pixels (90 megapixels)" in problem.detail


def test_tiny_images_and_images_far_from_the_usual_size_are_reported(tmp_path, capsys):
    for index in range(8):
        save_image(tmp_path / f"tile{index}.png", (64, 64), seed=index)
    save_image(tmp_path / "dot.png", (1, 1))
    save_image(tmp_path / "scene.png", (1024, 600))  # side 784 px, 12x the median
    save_image(tmp_path / "bigger.png", (256, 256))  # 4x: within the usual range
    save_image(tmp_path / "thumb.png", (8, 6))  # side 7 px: 9x smaller, and tiny
    _, problems = scan.scan_folder(tmp_path)
    assert [(p.path.split("/")[-1], p.kind) for p in problems] == [
        ("dot.png", "tiny-image"), ("scene.png", "odd-size"), ("thumb.png", "tiny-image")]
    assert "12x larger than this folder's usual image (median side 64 px)" in problems[1].detail
    assert cli.main(["scan", str(tmp_path)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 4 and lines[-1] == "checked 12 files: 3 problem(s)"


def test_a_folder_that_cannot_be_listed_is_one_problem_not_a_crash(tmp_path, monkeypatch):
    save_image(tmp_path / "cat" / "0.png")
    save_image(tmp_path / "locked" / "0.png")
    real_scandir = os.scandir

    def scandir(folder):  # as root, permissions would not stop the listing: refuse it here
        if Path(folder).name == "locked":
            raise PermissionError(errno.EACCES, "Permission denied")
        return real_scandir(folder)

    monkeypatch.setattr(scan.os, "scandir", scandir)
    checked, problems = scan.scan_folder(tmp_path)
    assert checked == 1
    assert [(p.path, p.kind) for p in problems] == [(str(tmp_path / "locked"), "unreadable")]
    assert "Permission denied" in problems[0].detail


# --- issue 30 point 8: what the loader refuses or mislabels is reported --------------------------------

def test_a_fifo_named_like_an_image_is_reported_without_opening_it(tmp_path):
    save_image(tmp_path / "cat" / "0.png")
    save_image(tmp_path / "dog" / "0.png")
    os.mkfifo(tmp_path / "cat" / "pipe.jpg")  # opening it would block until a writer comes
    (tmp_path / "dog" / "link.png").symlink_to(tmp_path / "cat" / "pipe.jpg")
    _, problems = scan.scan_folder(tmp_path)
    assert [(p.path.split("/")[-1], p.kind) for p in problems] == [("pipe.jpg", "not-a-file"),
                                                                   ("link.png", "not-a-file")]
    assert "a FIFO, not a regular file" in problems[0].detail


def layout(root, classes_of):
    for split, classes in classes_of.items():
        for name in classes:
            save_image(root / split / name / "0.png")
    return root


@pytest.mark.parametrize("classes_of, expected", [
    ({"train": ["a", "b", "c"], "valid": ["a", "c"]}, [("", "split-classes", "valid/ lacks b")]),
    ({"train": ["a", "b"], "val": ["a", "b", "c"]}, [("", "split-classes", "val/ has c, which train/ lacks")]),
    ({"train": ["a"], "val": ["a"]}, [("train", "single-class", "only one class (a)")]),
])
def test_splits_with_other_classes_and_a_single_class_are_reported(tmp_path, classes_of, expected):
    root = layout(tmp_path / "data", classes_of)
    _, problems = scan.scan_folder(root)
    assert [(str(Path(p.path).relative_to(root)).strip("."), p.kind) for p in problems] == \
        [(path, kind) for path, kind, _ in expected]
    assert expected[0][2] in problems[0].detail


def test_a_folder_of_datasets_is_recognised_and_each_dataset_checked(tmp_path, capsys):
    root = tmp_path / "samples"
    layout(root / "first", {"train": ["a", "b"], "val": ["a", "b"]})
    layout(root / "second", {"train": ["a"], "val": ["a"]})
    _, problems = scan.scan_folder(root)
    # the datasets are not taken for classes; the second dataset's own single class is still found
    assert [(p.path, p.kind) for p in problems] == [(str(root / "second" / "train"), "single-class")]
    assert cli.main(["scan", str(root)]) == 1
    assert f"{root} is a folder of 2 datasets (first, second)" in capsys.readouterr().out
    # the project's own data_samples/ scans clean, its dataset not mistaken for a class
    assert cli.main(["scan", str(Path(__file__).parents[1] / "data_samples")]) == 0, capsys.readouterr().out
    assert "a folder of 1 dataset (landcover-synth)" in capsys.readouterr().out


def test_an_empty_folder_and_empty_class_folders_are_reported(tmp_path, capsys):
    assert cli.main(["scan", str(tmp_path)]) == 1
    assert "empty-folder" in capsys.readouterr().out
    root = layout(tmp_path / "data", {"train": ["a", "b"], "val": ["a", "b"]})
    (root / "val" / "b" / "0.png").unlink()
    (root / "train" / "c").mkdir()
    (root / "val" / "c").mkdir()
    _, problems = scan.scan_folder(root)
    assert [(p.path, p.kind) for p in problems] == [(str(root / "train" / "c"), "empty-class"),
                                                    (str(root / "val" / "b"), "empty-class"),
                                                    (str(root / "val" / "c"), "empty-class")]


def test_data_make_test_0_writes_no_test_folder_and_scans_clean(tmp_path, capsys):
    out = tmp_path / "lc"
    assert cli.main(["data", "make", "--out", str(out), "--image-size", "16", "--train", "1", "--val", "1",
                     "--test", "0"]) == 0
    assert not (out / "test").exists()
    assert cli.main(["scan", str(out)]) == 0, capsys.readouterr().out


def test_a_bad_labels_value_is_refused_before_any_image_is_hashed(capsys):
    """Issue 49 point 14: `scan --duplicates --labels -p lr=-1` hashed every image before refusing the value."""
    folder = str(Path(__file__).parents[1] / "data_samples" / "landcover-synth")
    assert cli.main(["scan", folder, "--duplicates", "--labels", "--no-progress", "-p", "lr=-1"]) == 2
    captured = capsys.readouterr()
    assert "hashed" not in captured.out and "lr" in captured.err and len(captured.err.strip().splitlines()) == 1


def test_a_float_tiff_is_refused_by_the_loader_and_the_scan_says_so(tmp_path):
    """Issue 49 point 14: scan said the loaders scale a float TIFF, which PIL's convert clips silently and the
    speed-run recipe's torchvision decoder cannot read at all."""
    from course_lib.data.images import BadImageError, load_rgb

    path = tmp_path / "reflectance.tif"
    Image.fromarray(np.linspace(0, 1, 64 * 64, dtype=np.float32).reshape(64, 64), "F").save(path)
    problems = scan.scan_file(path)
    assert [p.kind for p in problems] == ["high-bit-depth"]
    detail = problems[0].detail
    assert "the loaders refuse it" in detail and "scale" not in detail and "use decoder=pil" in detail
    with pytest.raises(BadImageError, match=r"mode F \(a 32-bit float image\).*convert it to 8 bits"):
        load_rgb(path)
