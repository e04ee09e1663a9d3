"""A long-tailed subset of a training split with a fixed imbalance ratio, the construction of the
long-tailed CIFAR benchmarks (Cui et al. 2019, "Class-Balanced Loss Based on Effective Number of
Samples", arXiv:1901.05555, section 5): class k of C keeps n_k = n_max x ratio^(-k / (C - 1))
images, so the first class keeps n_max and the last n_max / ratio. Only the training split is cut;
validation and test stay as they are, so per-class recall is measured on every class alike.

The subset keeps the parent's samples (a `TransformedSubset` by index, or for storage=device a
`ResidentSplit` of the chosen rows), so a pre-decoded cache built once serves every ratio.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from course_lib.config import ConfigError
from course_lib.data.class_split import targets_of
from course_lib.data.datasets import DataBundle, TransformedSubset
from course_lib.data.resident import ResidentSplit


def long_tail_counts(available, imbalance_ratio: float) -> list[int]:
    """Images to keep per class (class order = index order): n_k = floor(n_max x ratio^(-k/(C-1))),
    with n_max the smallest class's count (so every class can give what it is asked for), and at
    least 1. `available`: images per class in the full split."""
    available = [int(count) for count in available]
    if len(available) < 2:
        raise ConfigError(f"a long tail needs at least 2 classes, got {len(available)}")
    if not (math.isfinite(imbalance_ratio) and imbalance_ratio >= 1):
        raise ConfigError(f"imbalance_ratio must be 1 (balanced) or more (largest / smallest class), "
                          f"got {imbalance_ratio!r}")
    head = min(available)
    if head < 1:
        raise ConfigError("a class of the training split has no images: no long tail can be cut from it")
    last = len(available) - 1
    # The small epsilon keeps float rounding (e.g. 200 x 0.1 = 19.999...) from losing an image.
    return [max(1, math.floor(head * imbalance_ratio ** (-k / last) + 1e-9)) for k in range(len(available))]


def long_tail_indices(targets, num_classes: int, imbalance_ratio: float, seed: int = 0) -> list[int]:
    """Sorted indices of a long-tailed subset of images with labels `targets`: `long_tail_counts`
    images of each class, drawn without replacement with `seed`."""
    targets = np.asarray(targets, dtype=np.int64)
    members = [np.flatnonzero(targets == label) for label in range(num_classes)]
    counts = long_tail_counts([len(m) for m in members], imbalance_ratio)
    rng = np.random.default_rng(seed)
    chosen = [rng.choice(m, count, replace=False) for m, count in zip(members, counts)]
    return sorted(np.concatenate(chosen).tolist())


def long_tail_split(dataset, num_classes: int, imbalance_ratio: float, seed: int = 0):
    """The long-tailed subset of a training split: a `TransformedSubset` of it (no transform of its
    own: the parent's applies), or for a `ResidentSplit` a resident split of the chosen rows."""
    indices = long_tail_indices(targets_of(dataset), num_classes, imbalance_ratio, seed)
    if isinstance(dataset, ResidentSplit):
        rows = torch.tensor(indices, device=dataset.images.device)
        return ResidentSplit(dataset.images.index_select(0, rows), dataset.targets_tensor.index_select(0, rows),
                             dataset.classes)
    return TransformedSubset(dataset, indices)


def long_tail_bundle(bundle: DataBundle, imbalance_ratio: float, seed: int = 0) -> DataBundle:
    """`bundle` with its training split cut to a long tail (`long_tail_split`); validation and test unchanged."""
    train = long_tail_split(bundle.train, len(bundle.classes), imbalance_ratio, seed)
    return dataclasses.replace(bundle, train=train,
                               source=f"{bundle.source} [long tail, imbalance ratio {imbalance_ratio:g}]")
