"""A source and a target task cut from one labelled dataset by class: disjoint class sets (the
source is pre-trained on some classes, the target fine-tunes on the others), and a fixed number of
labelled training images per target class, the few-label setting of transfer studies (Kornblith,
Shlens & Le 2019, "Do Better ImageNet Models Transfer Better?", arXiv:1805.08974, section 4.3).

Subsets keep the parent's samples and relabel them 0..k-1 in the order of the chosen classes, so a
pre-decoded cache built once serves every subset; the bundle's device stage and pipeline carry over.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from course_lib.config import ConfigError
from course_lib.data.datasets import DataBundle, targets_of


def split_classes(classes, target_count: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """(source classes, target classes): `target_count` classes drawn with `seed` for the target,
    the rest for the source; both in the dataset's order, disjoint, together every class."""
    classes = list(classes)
    if not 1 <= target_count < len(classes):
        raise ConfigError(f"target_classes must be 1 to {len(classes) - 1} (the dataset has {len(classes)} "
                          f"classes and the source needs at least one), got {target_count}")
    picked = set(np.random.default_rng(seed).choice(len(classes), target_count, replace=False).tolist())
    return ([name for i, name in enumerate(classes) if i not in picked],
            [name for i, name in enumerate(classes) if i in picked])


def smallest_class(targets, wanted: list[int]) -> int:
    """Images of the smallest class in `wanted` (class indices): the most `per_class` can ask for."""
    targets = np.asarray(targets)
    return min(int((targets == label).sum()) for label in wanted)


def check_per_class(targets, wanted: list[int], per_class: int, parameter: str = "per_class",
                    classes: list[str] | None = None) -> None:
    """Raise ConfigError (one line naming `parameter` and the largest value that fits) when a class in
    `wanted` has fewer than `per_class` training images."""
    if not per_class:
        return
    targets = np.asarray(targets)
    counts = {label: int((targets == label).sum()) for label in wanted}
    short = min(counts, key=counts.get)
    if counts[short] < per_class:
        name = classes[short] if classes is not None else f"class {short}"
        raise ConfigError(f"{parameter}={per_class} asks for more training images per class than {name} has "
                          f"({counts[short]}); set -p {parameter}=N with N <= {counts[short]}")


def sample_per_class(targets, wanted: list[int], per_class: int = 0, seed: int = 0, parameter: str = "per_class",
                     classes: list[str] | None = None) -> list[int]:
    """Indices of `per_class` images of each class in `wanted` (class indices), drawn with `seed`; per_class=0: every
    image of those classes. Sorted. A class with fewer images is an error naming `parameter` (`check_per_class`)."""
    targets = np.asarray(targets)
    check_per_class(targets, wanted, per_class, parameter, classes)
    rng = np.random.default_rng(seed)
    chosen = []
    for label in wanted:
        members = np.flatnonzero(targets == label)
        chosen += (rng.choice(members, per_class, replace=False) if per_class else members).tolist()
    return sorted(chosen)


class ClassSubset:
    """Images `indices` of `dataset`, whose labels are mapped by `relabel` (old index -> new index)."""

    def __init__(self, dataset, indices, relabel: dict[int, int], classes: list[str]):
        self.dataset, self.indices, self.relabel, self.classes = dataset, list(indices), dict(relabel), list(classes)
        parent = targets_of(dataset)
        self.targets = [self.relabel[int(parent[i])] for i in self.indices]

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        image, target = self.dataset[self.indices[index]]
        return image, self.relabel[int(target)]


def subset_bundle(bundle: DataBundle, classes: list[str], per_class: int = 0, seed: int = 0,
                  val_per_class: int = 0, parameter: str = "per_class") -> DataBundle:
    """`bundle` restricted to `classes` (relabelled 0..len-1 in that order): `per_class` training images per class
    drawn with `seed`, `val_per_class` validation and test images with seed 0 for every run (0: all of them)."""
    unknown = [name for name in classes if name not in bundle.classes]
    if unknown:
        raise ConfigError(f"classes {unknown} are not in the data (its classes: {', '.join(bundle.classes)})")
    wanted = [bundle.classes.index(name) for name in classes]
    relabel = {old: new for new, old in enumerate(wanted)}

    def part(dataset, count, draw, evaluation=False):
        if dataset is None:
            return None
        targets = targets_of(dataset)
        if evaluation:  # at most what the smallest class has: evaluation never refuses a count
            count = min(count, smallest_class(targets, wanted))
        return ClassSubset(dataset, sample_per_class(targets, wanted, count, draw, parameter, bundle.classes), relabel,
                           classes)

    described = f"{bundle.source} [{len(classes)} classes" + (f", {per_class} labels per class" if per_class else "") + "]"
    return dataclasses.replace(bundle, train=part(bundle.train, per_class, seed),
                               val=part(bundle.val, val_per_class, 0, True),
                               test=part(bundle.test, val_per_class, 0, True),
                               classes=list(classes), source=described)
