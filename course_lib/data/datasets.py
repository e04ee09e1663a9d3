"""The workbook's dataset classes: an ImageFolder with the bad-image policy (`ImageFolderDataset`),
uint8 arrays in memory (`ArrayImageDataset`), a subset with its own transform (`TransformedSubset`),
the train/val/test `DataBundle`, the seeded stratified split and `max_train_images` choice, and a
grid of samples to look at. Which datasets a config names, and how they are stored: `pipeline.py`.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from course_lib.config import RECIPES, Config, ConfigError, make_config, resolve_profile
from course_lib.data.device_augment import DeviceStage
from course_lib.data.images import BadImageError, DataFolderError, list_image_folder, load_rgb, skipped_line
from course_lib.data.landcover import SPLITS, landcover_cache_dir  # noqa: F401 (SPLITS: every bundle has these)
from course_lib.data.transforms import denormalize
from course_lib.paths import DataChoice, choose_data, resolve_path

log = logging.getLogger(__name__)


class ImageFolderDataset:
    """torchvision's ImageFolder layout with `list_image_folder`'s rules for links (what `workbook scan` reports is
    what loads) and the bad-image policy: "fail" raises BadImageError naming the file (a worker's is re-raised in the
    main process, so nothing hangs); "skip" logs the file once and returns the next readable sample. Skipped files
    are flagged in a shared-memory tensor, so `skipped` counts those the DataLoader workers (each with its own copy
    of the dataset) left out too."""

    def __init__(self, root: str | os.PathLike, transform=None, bad_images: str = "fail", loader=None, *,
                 follow_links: bool = False):
        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"image folder {root} does not exist; check data_dir "
                                    "(or run `workbook data make` to generate one)")
        self.root = root
        self.classes, self.samples = list_image_folder(root, follow_links=follow_links, bad_images=bad_images)
        self.targets = [target for _, target in self.samples]
        # loader: path -> image, raising BadImageError (e.g. decode.FileDecoder("opencv")); picklable.
        self.loader = loader or load_rgb
        self.transform = transform
        self.bad_images = bad_images
        self._skipped_flags = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()  # one per sample

    @property
    def skipped(self) -> set[str]:
        """Paths left out under bad_images=skip so far, by this process and its DataLoader workers."""
        return {self.samples[index][0] for index in self._skipped_flags.nonzero().flatten().tolist()}

    def with_transform(self, transform) -> ImageFolderDataset:
        """The same file list (not listed again) with another transform, e.g. for a second split."""
        other = copy.copy(self)
        other.transform = transform
        other._skipped_flags = torch.zeros(len(self.samples), dtype=torch.bool).share_memory_()
        return other

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        for attempt in range(len(self.samples)):
            position = (index + attempt) % len(self.samples)
            path, target = self.samples[position]
            try:
                image = self.loader(path)
            except BadImageError as error:
                if self.bad_images == "fail":
                    raise
                if not self._skipped_flags[position]:
                    self._skipped_flags[position] = True
                    log.warning("skipping %s", skipped_line(error))
                continue
            return (self.transform(image) if self.transform else image), target
        raise BadImageError(f"no readable image in {Path(self.samples[0][0]).parents[1]}")


def skipped_images(dataset) -> int:
    """Files the ImageFolderDataset under `dataset` (through subsets' `.dataset`) has left out
    under bad_images=skip so far; 0 for other datasets."""
    while dataset is not None and not isinstance(dataset, ImageFolderDataset):
        dataset = getattr(dataset, "dataset", None)
    return len(dataset.skipped) if dataset is not None else 0


class ArrayImageDataset:
    """Images held in memory as uint8 arrays (N x H x W x C), served as PIL images."""

    def __init__(self, images: np.ndarray, targets, classes, transform=None):
        self.images, self.targets, self.classes, self.transform = images, list(map(int, targets)), classes, transform

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        image = Image.fromarray(self.images[index]).convert("RGB")
        return (self.transform(image) if self.transform else image), self.targets[index]


class TransformedSubset:
    """A subset of a dataset with its own transform (so train and val of one split differ). `memo`, a dict: each
    sample is transformed once and kept there, for a deterministic transform of a small split (digits)."""

    def __init__(self, dataset, indices, transform=None, memo: dict | None = None):
        self.dataset, self.indices, self.transform, self.memo = dataset, list(indices), transform, memo
        self.classes = getattr(dataset, "classes", None)
        targets = getattr(dataset, "targets", None)
        self.targets = [targets[i] for i in self.indices] if targets is not None else None

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        if self.memo is not None and index in self.memo:
            return self.memo[index]
        image, target = self.dataset[self.indices[index]]
        if not isinstance(image, torch.Tensor):  # uint8 C x H x W from a FileDecoder or the cache pass as they are
            image = (image if isinstance(image, Image.Image) else Image.fromarray(np.asarray(image))).convert("RGB")
        sample = (self.transform(image) if self.transform else image), int(target)
        if self.memo is not None:
            self.memo[index] = sample
        return sample


@dataclasses.dataclass
class DataBundle:
    train: object
    val: object
    test: object
    classes: list
    source: str  # where the images came from, for reports
    # What happens to a batch after the DataLoader: the copy to the training device and, for
    # uint8 batches, augmentation (training) or normalisation (evaluation) there.
    device_stage: DeviceStage = dataclasses.field(default_factory=lambda: DeviceStage())
    pipeline: str = "decoder pil, storage files, augmentation cpu"  # how batches are made, for the engine's first log line

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def split_indices(targets, fractions, seed, where: str = "the data",
                  fix: str = "add a val/ folder beside train/, or"):
    """Stratified split of range(len(targets)) into len(fractions) parts (scikit-learn); too few images for every
    part to hold each class is one DataFolderError naming `where` and the fix (`fix`, then the images it takes)."""
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(targets))
    try:
        first, rest = train_test_split(indices, train_size=fractions[0], stratify=targets, random_state=seed)
        if len(fractions) == 2:
            return [first.tolist(), rest.tolist()]
        rest_targets = np.asarray(targets)[rest]
        second, third = train_test_split(rest, train_size=fractions[1] / (1 - fractions[0]),
                                         stratify=rest_targets, random_state=seed)
    except ValueError:  # sklearn: a class with 1 image, or a part smaller than the number of classes
        counts = np.unique(np.asarray(targets), return_counts=True)[1] if len(targets) else np.zeros(1, int)
        needed = math.ceil(len(counts) / min(fractions))  # the smallest part must hold one image per class
        raise DataFolderError(f"{where} has too few images to split by class into {len(fractions)} parts "
                              f"({len(targets)} images, {len(counts)} classes, the smallest with {counts.min()}); "
                              f"{fix} about {needed} images, 2 or more per class") from None
    return [first.tolist(), second.tolist(), third.tolist()]


def limit_indices(count: int, max_images: int, seed: int, targets=None,
                  name: str = "max_train_images") -> list[int] | None:
    """Which `max_images` of `count` training images to keep (seeded, sorted; None: all), the one rule for
    max_train_images. With `targets` no class is left out: the random choice stands when it holds every class (so
    earlier choices stay the same), else one image of each class is taken first and the rest at random."""
    if not max_images or max_images >= count:
        return None
    keep = sorted(np.random.default_rng(seed).permutation(count)[:max_images].tolist())
    if targets is None:
        return keep
    targets = np.asarray(targets)
    classes = np.unique(targets)
    if len(np.unique(targets[keep])) == len(classes):
        return keep
    if max_images < len(classes):
        raise DataFolderError(f"{name}={max_images} cannot keep one image of each of the {len(classes)} classes; "
                              f"set it to {len(classes)} or more (0 keeps every image)")
    generator = np.random.default_rng(seed)
    one_each = [int(generator.choice(np.flatnonzero(targets == label))) for label in classes]
    others = np.setdiff1d(np.arange(count), one_each)
    return sorted(one_each + generator.permutation(others)[:max_images - len(classes)].tolist())


def config_with_data(profile: str | None, *overlays, find_real: bool = True, **values) -> tuple[Config, DataChoice]:
    """(Config, DataChoice) for `profile`, a chapter's `overlays` and `values` (None, and "" for dataset or data_dir:
    not given), with the data `paths.choose_data` picks: the CLI and the notebooks build configs here, so they agree."""
    given = {name: value for name, value in values.items()
             if value is not None and not (name in ("dataset", "data_dir") and value == "")}
    # A recipe that names its data (imagenette) is the reader's word for it, as a data_dir parameter would be.
    named = RECIPES.get(given.get("recipe") or "", {})
    given.update({name: named[name] for name in ("dataset", "data_dir") if name in named and name not in given})
    choice = choose_data(resolve_profile(profile), given.get("data_dir"), given.get("dataset"), find_real=find_real)
    return make_config(profile, *overlays, **{**choice.overrides, **given}), choice


def image_folder_root(config: Config) -> Path:
    """The folder an image-folder config reads (data_dir, or the generated landcover-synth, made on
    first use), for code that reads the files itself, such as notebook 12's hand-written loop."""
    if config.data_dir:
        return resolve_path(config.data_dir)
    if config.dataset == "landcover-synth":
        return landcover_cache_dir(seed=0)
    raise ConfigError(f"dataset={config.dataset} is not an image folder; set data_dir=<folder with train/ and valid/> "
                      "(workbook bench: or pass --folder)")


def targets_of(dataset) -> np.ndarray:
    """The class index of every item of `dataset` (its `.targets` when it has them), as an array."""
    targets = getattr(dataset, "targets", None)
    if targets is None:
        targets = [dataset[i][1] for i in range(len(dataset))]
    return np.asarray(targets, dtype=np.int64)


def sample_grid(dataset, classes, per_class: int = 6, seed: int = 0):
    """A matplotlib figure: one row per class, `per_class` images each (denormalized)."""
    import matplotlib.pyplot as plt

    targets = targets_of(dataset)
    rng = np.random.default_rng(seed)
    figure, axes = plt.subplots(len(classes), per_class, figsize=(per_class * 1.1, len(classes) * 1.15),
                                squeeze=False)
    for row, name in enumerate(classes):
        members = np.flatnonzero(targets == row)
        picks = rng.choice(members, size=min(per_class, len(members)), replace=False) if len(members) else []
        for column in range(per_class):
            axis = axes[row, column]
            axis.axis("off")
            if column < len(picks):
                image, _ = dataset[int(picks[column])]
                # uint8 images (augmentation=device) are shown as they are; floats were normalised
                shown = image if image.dtype == torch.uint8 else denormalize(image)
                axis.imshow(shown.permute(1, 2, 0).numpy())
        axes[row, 0].set_title(name, fontsize=8, loc="left")
    figure.tight_layout()
    return figure
