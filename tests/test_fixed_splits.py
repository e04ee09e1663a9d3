"""The committed EuroSAT split (counts always; the exact train/valid lists against the shared folder
when it is beside the project) and the seeded validation carve-out of CIFAR-10 and Imagenette."""
import json
import random

import pytest
from PIL import Image

from course_lib.data import fixed_splits
from course_lib.data.fixed_splits import (
    EUROSAT_CLASS_COUNTS,
    SplitFileError,
    carve_out,
    load_eurosat_split,
    make_eurosat_split,
    valid_count,
    write_eurosat_split,
)


def _by_split(split_of):
    counts = {}
    for file_name, split in split_of.items():
        class_name = file_name.rsplit("_", 1)[0]
        counts.setdefault(split, {}).setdefault(class_name, 0)
        counts[split][class_name] += 1
    return counts


def test_the_committed_split_covers_the_release_70_15_15_per_class():
    split_of = load_eurosat_split()
    assert len(split_of) == sum(EUROSAT_CLASS_COUNTS.values()) == 27_000
    counts = _by_split(split_of)
    assert {split: sum(per_class.values()) for split, per_class in counts.items()} == {
        "train": 18_900, "valid": 4_050, "test": 4_050}
    for class_name, total in EUROSAT_CLASS_COUNTS.items():
        assert counts["valid"][class_name] == counts["test"][class_name] == pytest.approx(0.15 * total, abs=1)
        assert counts["train"][class_name] == pytest.approx(0.70 * total, abs=1)
    assert set(split_of) == {f"{c}_{n}.jpg" for c, total in EUROSAT_CLASS_COUNTS.items() for n in range(1, total + 1)}


def test_the_committed_train_and_valid_lists_are_the_shared_folders_file_names(eurosat_dir):
    split_of = load_eurosat_split()
    for split in ("train", "valid"):
        on_disk = {(path.parent.name, path.name) for path in (eurosat_dir / split).glob("*/*.jpg")}
        committed = {(name.rsplit("_", 1)[0], name) for name, s in split_of.items() if s == split}
        assert on_disk == committed, f"{split}: {len(on_disk ^ committed)} names differ"
    # The generator reproduces the committed file from the folder, byte for byte.
    assert make_eurosat_split(eurosat_dir) == json.loads(fixed_splits.EUROSAT_SPLIT_FILE.read_text())


def _fake_release_folder(root, picks):
    for split, names in picks.items():
        for name in names:
            folder = root / split / name.rsplit("_", 1)[0]
            folder.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (4, 4)).save(folder / name)


def test_the_generator_writes_a_file_that_loads_with_every_other_image_as_test(tmp_path):
    _fake_release_folder(tmp_path / "eurosat", {"train": ["Forest_1.jpg", "River_7.jpg"], "valid": ["Forest_2.jpg"]})
    path = write_eurosat_split(tmp_path / "eurosat", tmp_path / "split.json")
    split_of = load_eurosat_split(path)
    assert (split_of["Forest_1.jpg"], split_of["River_7.jpg"], split_of["Forest_2.jpg"]) == ("train", "train", "valid")
    assert sum(split == "test" for split in split_of.values()) == 27_000 - 3
    assert len(path.read_text().splitlines()) == 4 + len(EUROSAT_CLASS_COUNTS) + 3  # one line per class


def test_a_folder_that_is_not_the_release_is_refused_in_one_line(tmp_path):
    _fake_release_folder(tmp_path / "bad", {"train": ["Forest_3001.jpg"], "valid": []})
    (tmp_path / "bad" / "valid").mkdir()
    with pytest.raises(SplitFileError, match=r"Forest_3001.jpg: index 3001 is beyond the release's 3000") as error:
        make_eurosat_split(tmp_path / "bad")
    assert "\n" not in str(error.value)


def test_an_altered_split_file_is_refused_in_one_line(tmp_path):
    content = json.loads(fixed_splits.EUROSAT_SPLIT_FILE.read_text())
    content["classes"]["Forest"]["valid"][0] += 1  # one image moved from valid to train
    altered = tmp_path / "altered.json"
    altered.write_text(json.dumps(content))
    with pytest.raises(SplitFileError, match="does not match its sha256") as error:
        load_eurosat_split(altered)
    assert "\n" not in str(error.value)


def test_the_carve_out_is_a_tenth_per_class_fixed_and_independent_of_order():
    names = [f"train_{i:05d}.png" for i in range(5000)]
    chosen = carve_out(names, "cifar10")
    assert len(chosen) == 500 == valid_count(5000)
    shuffled = names[:]
    random.Random(1).shuffle(shuffled)
    assert carve_out(shuffled, "cifar10") == chosen
    assert carve_out(names, "imagenette") != chosen  # the dataset name is part of the key
    assert [valid_count(n) for n in (0, 1, 2, 19, 20, 963)] == [0, 0, 1, 1, 2, 96]
