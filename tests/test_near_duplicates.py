"""Near-duplicates and leaks by perceptual hash (`data.near_duplicates`, `workbook scan --duplicates`): a
resized or recompressed copy matches, a different image does not, and a folder's copies are reported
within a split and across splits."""
import contextlib
import io

import numpy as np
import pytest
from PIL import Image

from course_lib import cli
from course_lib.data import near_duplicates


def _scene(seed: int, size: int = 64) -> Image.Image:
    """A smooth random scene (an 8x8 colour grid, upsampled): low frequencies, like a land-cover tile."""
    grid = np.random.default_rng(seed).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    return Image.fromarray(grid).resize((size, size), Image.BICUBIC)


def _save(image: Image.Image, path, quality: int = 95):
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, quality=quality)
    return path


def _distance(first, second) -> int:
    words = near_duplicates.pack([near_duplicates.image_hash(first), near_duplicates.image_hash(second)])
    return int(np.bitwise_count(words[0] ^ words[1]).sum())


def test_a_resized_or_recompressed_copy_matches_and_a_different_image_does_not(tmp_path):
    original = _save(_scene(0), tmp_path / "a.jpg")
    resized = _save(_scene(0).resize((48, 48), Image.BILINEAR), tmp_path / "a_small.jpg")
    recompressed = _save(_scene(0), tmp_path / "a_q40.jpg", quality=40)
    other = _save(_scene(1), tmp_path / "b.jpg")
    assert _distance(original, original) == 0
    assert _distance(original, resized) <= near_duplicates.DEFAULT_MAX_DISTANCE
    assert _distance(original, recompressed) <= near_duplicates.DEFAULT_MAX_DISTANCE
    assert _distance(original, other) > 3 * near_duplicates.DEFAULT_MAX_DISTANCE


@pytest.fixture
def leaky_folder(tmp_path):
    """train/ and valid/ with one leak (scene 0 resized into valid) and one duplicate within train
    (scene 2 under two classes); scenes 1, 3, 4 are unique."""
    root = tmp_path / "data"
    _save(_scene(0), root / "train" / "forest" / "0.jpg")
    _save(_scene(1), root / "train" / "forest" / "1.jpg")
    _save(_scene(2), root / "train" / "forest" / "2.jpg")
    _save(_scene(2), root / "train" / "water" / "2_again.jpg", quality=70)
    _save(_scene(3), root / "train" / "water" / "3.jpg")
    _save(_scene(0).resize((56, 56)), root / "valid" / "forest" / "0_copy.jpg")
    _save(_scene(4), root / "valid" / "water" / "4.jpg")
    return root


def test_a_folder_reports_duplicates_within_a_split_and_leaks_across(leaky_folder):
    checked, matches = near_duplicates.scan_duplicates(leaky_folder)
    assert checked == 7
    assert [(m.first, m.second, m.leak) for m in sorted(matches, key=lambda m: m.leak)] == [
        ("train/forest/2.jpg", "train/water/2_again.jpg", False),
        ("train/forest/0.jpg", "valid/forest/0_copy.jpg", True)]
    assert "leak train/val" in next(m for m in matches if m.leak).line()
    assert near_duplicates.summary(checked, matches) == ("hashed 7 images: 1 near-duplicate pair(s) within a split, "
                                                         "1 leak(s) across splits (train/val)")


def test_scan_duplicates_from_the_command_line(leaky_folder, tmp_path):
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        status = cli.main(["scan", str(leaky_folder), "--duplicates", "--no-progress"])
    assert status == 1  # something was found
    assert "1 leak(s) across splits" in output.getvalue().splitlines()[-1]
    clean = tmp_path / "clean"
    for seed in range(3):
        _save(_scene(10 + seed), clean / "forest" / f"{seed}.jpg")
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        assert cli.main(["scan", str(clean), "--duplicates", "--no-progress"]) == 0
    assert output.getvalue().strip() == "hashed 3 images: 0 near-duplicate pair(s) within a split, 0 leak(s) across splits"


@pytest.mark.parametrize("option", [["--max-distance", "65"], ["--folds", "1"], ["--top", "-1"]])
def test_bad_scan_options_are_one_line(leaky_folder, option, capsys):
    assert cli.main(["scan", str(leaky_folder), "--duplicates", *option]) == 2
    error = capsys.readouterr().err.strip()
    assert error.startswith(f"workbook scan: error: {option[0]} must be between") and "\n" not in error


def test_matches_need_one_name_and_split_per_hash():
    words = near_duplicates.pack([np.zeros(64, bool), np.ones(64, bool)])
    with pytest.raises(ValueError, match="2 hashes need as many names and splits"):
        near_duplicates.find_matches(words, ["a"], ["train", "train"])
    assert near_duplicates.find_matches(words, ["a", "b"], ["train", "train"]) == []  # 64 bits apart


def test_control_characters_in_file_names_are_escaped_on_the_line():
    """A newline or an escape sequence in a file name once reached the terminal as is (issue 49)."""
    from course_lib.data.near_duplicates import Match

    line = Match("train/a\nfake line.png", "valid/\x1b[31mred.png", "train", "valid", 0).line()
    assert "\n" not in line and "\x1b" not in line
    assert line == "leak train/valid (0 bits): train/a\\nfake line.png ~ valid/\\x1b[31mred.png"


def test_many_identical_images_are_counted_all_and_listed_closest_first_within_a_bound():
    """Issue 49 point 6: 8,000 identical images were 32 million kept pairs and an out-of-memory kill."""
    count = 2000
    words = near_duplicates.pack([np.zeros(64, dtype=bool)] * count)
    names = [f"img{index:04d}.png" for index in range(count)]
    splits = ["train" if index % 2 else "val" for index in range(count)]
    matches = near_duplicates.find_matches(words, names, splits, limit=50)
    assert len(matches) == 50 and matches.total == count * (count - 1) // 2
    assert matches.leaks == (count // 2) ** 2 and sum(matches.between.values()) == matches.leaks
    assert all(match.distance == 0 for match in matches) and not matches.complete
    assert near_duplicates.summary(count, matches) == (
        f"hashed 2000 images: {matches.total - matches.leaks} near-duplicate pair(s) within a split, "
        f"{matches.leaks} leak(s) across splits (train/val, val/train); the 50 closest are listed")


def test_flat_tiles_of_different_colours_are_not_duplicates_but_a_recoloured_copy_of_one_colour_is(tmp_path):
    """Issue 49 point 14: pHash reads grey, so flat red, green and blue tiles of different classes were 0-bit
    "duplicates" and "leaks"; a copy recompressed keeps its colour and still matches."""
    for split, name, colour in (("train", "red", (200, 30, 30)), ("val", "green", (30, 200, 30)),
                                ("test", "blue", (30, 30, 200))):
        _save(Image.new("RGB", (64, 64), colour), tmp_path / split / name / "tile.jpg")
    _save(Image.new("RGB", (64, 64), (200, 30, 30)), tmp_path / "val" / "red" / "copy.jpg", quality=40)
    checked, matches = near_duplicates.scan_duplicates(tmp_path)
    assert checked == 4
    assert [(m.first, m.second) for m in matches] == [("train/red/tile.jpg", "val/red/copy.jpg")]


def test_unreadable_and_oversized_images_are_left_out_and_named_in_the_summary(tmp_path, monkeypatch):
    """Issue 49 point 13: one unreadable file, a decompression bomb or a file without read permission ended
    `scan --duplicates` in a traceback."""
    from PIL import Image as PILImage

    _save(_scene(0), tmp_path / "train" / "a" / "one.jpg")
    _save(_scene(0), tmp_path / "val" / "a" / "one_copy.jpg")
    (tmp_path / "train" / "a" / "broken.jpg").write_bytes(b"not a jpeg")
    _save(Image.new("RGB", (300, 300)), tmp_path / "train" / "a" / "bomb.png")
    monkeypatch.setattr(PILImage, "MAX_IMAGE_PIXELS", 10_000)  # 300 x 300 is a bomb here (over twice the limit), as 14,000^2 is at PIL's
    checked, matches = near_duplicates.scan_duplicates(tmp_path)
    assert checked == 2 and matches.leaks == 1
    assert sorted(path for path, _ in matches.unreadable) == ["train/a/bomb.png", "train/a/broken.jpg"]
    line = near_duplicates.summary(checked, matches)
    assert "2 image(s) could not be read and were left out (first: train/a/b" in line and "\n" not in line
