"""One fixed split for everyone: the committed EuroSAT RGB split (`splits/eurosat_rgb.json`, every
image of the 27,000-image release named train, valid or test) and the seeded validation carve-out
of CIFAR-10's and Imagenette's own training sets. Two readers who run `workbook data get` get the
same images in the same folders, so their numbers compare.

EuroSAT: Helber et al., "EuroSAT: A Novel Dataset and Deep Learning Benchmark for Land Use and Land
Cover Classification", IEEE JSTARS 2019 (the release names its files `<Class>_<n>.jpg`, n = 1..count).
The train/valid lists are those of ../shared/datasets/eurosat_rgb (a public stratified 70/15/15 copy);
every other image of the release is test.
"""
from __future__ import annotations

import functools
import hashlib
import json
import re
from pathlib import Path

from course_lib.config import WorkbookError

EUROSAT_SPLIT_FILE = Path(__file__).resolve().parent / "splits" / "eurosat_rgb.json"
# Images per class in the EuroSAT RGB release (27,000 in all; Helber et al. 2019, table I).
EUROSAT_CLASS_COUNTS = {"AnnualCrop": 3000, "Forest": 3000, "HerbaceousVegetation": 3000, "Highway": 2500,
                        "Industrial": 2500, "Pasture": 2000, "PermanentCrop": 2500, "Residential": 3000,
                        "River": 2500, "SeaLake": 3000}
LAYOUT_SPLITS = ("train", "valid", "test")  # the folder names `workbook data get` writes
# Part of the carve-out's sort key: changing it would give everyone a new (equally fixed) validation set.
CARVE_OUT_SEED = 0
_EUROSAT_NAME = re.compile(r"(?P<class_name>[A-Za-z]+)_(?P<index>[1-9][0-9]*)\.jpg")


class SplitFileError(WorkbookError, ValueError):
    """The committed split file is missing or altered, or a folder does not match the release."""


def eurosat_lines(classes: dict) -> list[str]:
    """'<split>/<file name>' for every image of the release, in class then index order: what the
    file's checksum is taken over (train is every index not listed as valid or test)."""
    lines = []
    for class_name in sorted(classes):
        entry = classes[class_name]
        split_of = {index: "valid" for index in entry["valid"]} | {index: "test" for index in entry["test"]}
        lines += [f"{split_of.get(n, 'train')}/{class_name}_{n}.jpg" for n in range(1, entry["count"] + 1)]
    return lines


def checksum(lines: list[str]) -> str:
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def make_eurosat_split(folder: str | Path) -> dict:
    """The split file's content from a folder with train/<class>/ and valid/<class>/ subfolders of the
    release's JPEGs (../shared/datasets/eurosat_rgb): its train and valid names as they are, every
    other image of the release as test."""
    folder = Path(folder)
    listed: dict[str, dict[int, str]] = {name: {} for name in EUROSAT_CLASS_COUNTS}
    for split in ("train", "valid"):
        if not (folder / split).is_dir():
            raise SplitFileError(f"{folder / split} is missing; give the folder holding EuroSAT's train/ and valid/")
        for path in sorted((folder / split).glob("*/*")):
            match = _EUROSAT_NAME.fullmatch(path.name)
            name = match and match["class_name"]
            if not match or name != path.parent.name or name not in EUROSAT_CLASS_COUNTS:
                raise SplitFileError(f"{path} is not named <Class>_<n>.jpg inside its class folder; "
                                     "give a folder of the EuroSAT RGB release")
            index = int(match["index"])
            if index > EUROSAT_CLASS_COUNTS[name] or index in listed[name]:
                raise SplitFileError(f"{path}: index {index} is beyond the release's {EUROSAT_CLASS_COUNTS[name]} "
                                     f"{name} images or listed twice; give a folder of the EuroSAT RGB release")
            listed[name][index] = split
    classes = {}
    for name, count in EUROSAT_CLASS_COUNTS.items():
        split_of = listed[name]
        classes[name] = {"count": count,
                         "valid": sorted(n for n, split in split_of.items() if split == "valid"),
                         "test": sorted(n for n in range(1, count + 1) if n not in split_of)}
    return {"about": "EuroSAT RGB (Helber et al. 2019): the split of every image <Class>_<n>.jpg, n = 1..count, "
                     "of the 27,000-image release; train is every index not listed as valid or test",
            "source": "train and valid as in ../shared/datasets/eurosat_rgb (a public stratified 70/15/15 copy); "
                      "test: the rest of the release",
            "classes": classes,
            "sha256": checksum(eurosat_lines(classes))}


def write_eurosat_split(folder: str | Path, path: str | Path = EUROSAT_SPLIT_FILE) -> Path:
    """Regenerate the committed file from `folder` (see make_eurosat_split): one class per line, so
    a diff shows which class changed. Returns the path."""
    content = make_eurosat_split(folder)
    compact = dict(separators=(",", ":"))
    lines = ["{", f' "about": {json.dumps(content["about"])},', f' "source": {json.dumps(content["source"])},',
             ' "classes": {']
    names = list(content["classes"])
    for position, name in enumerate(names):
        comma = "," if position < len(names) - 1 else ""
        lines.append(f"  {json.dumps(name)}: {json.dumps(content['classes'][name], **compact)}{comma}")
    lines += [" },", f' "sha256": "{content["sha256"]}"', "}"]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    load_eurosat_split.cache_clear()
    return path


@functools.lru_cache(maxsize=4)
def load_eurosat_split(path: str | Path = EUROSAT_SPLIT_FILE) -> dict[str, str]:
    """{file name: 'train' | 'valid' | 'test'} for every image of the release, from the committed
    file, its checksum verified."""
    try:
        content = json.loads(Path(path).read_text())
        lines = eurosat_lines(content["classes"])
        stored = content["sha256"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SplitFileError(f"cannot read the EuroSAT split file {path} ({error}); restore it with "
                             "`git checkout -- course_lib/data/splits/eurosat_rgb.json`") from None
    if checksum(lines) != stored:
        raise SplitFileError(f"the EuroSAT split file {path} does not match its sha256 {stored[:12]}...; restore it "
                             "with `git checkout`, or regenerate it with scripts/make_eurosat_split.py")
    return {line.split("/", 1)[1]: line.split("/", 1)[0] for line in lines}


def valid_count(images: int) -> int:
    """How many of a class's `images` training images the carve-out takes for validation: a tenth,
    rounded down (CIFAR-10: 500 of 5,000), at least one when the class has two or more."""
    return max(1, images // 10) if images >= 2 else 0


def carve_out(names, dataset: str, seed: int = CARVE_OUT_SEED) -> set[str]:
    """The validation images of one class: the `valid_count(len(names))` names whose
    sha256('<seed>:<dataset>/<name>') sorts first. A rule of the names alone, so it does not depend
    on listing order, platform or numpy's generator (a name's rank never changes)."""
    names = list(names)
    ranked = sorted(names, key=lambda name: hashlib.sha256(f"{seed}:{dataset}/{name}".encode()).hexdigest())
    return set(ranked[:valid_count(len(names))])
