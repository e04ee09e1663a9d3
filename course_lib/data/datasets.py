"""Datasets for the workbook: the generated `landcover-synth` set (`landcover.py`), scikit-learn's
digits, any ImageFolder directory (EuroSAT RGB among them), and torchvision's EuroSAT and CIFAR-10
classes, with the workbook's bad-image policy; `build_datasets(config)` returns the splits a
config names, read, decoded and augmented as its data switches say (image folders: `pipeline.py`).

EuroSAT: Helber et al., "EuroSAT: A Novel Dataset and Deep Learning Benchmark for Land
Use and Land Cover Classification", IEEE JSTARS 2019. CIFAR-10: Krizhevsky, 2009.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import os
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from course_lib.config import Config, ConfigError, WorkbookError, make_config, resolve_profile
from course_lib.data.device_augment import DeviceStage
from course_lib.data.landcover import SPLITS, landcover_cache_dir  # noqa: F401 (SPLITS: every bundle has these)
from course_lib.data.transforms import denormalize
from course_lib.paths import CACHE_DIR, DataChoice, choose_data, resolve_path

log = logging.getLogger(__name__)
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
# Datasets held as decoded arrays in memory: no files for `decoder` or `storage` to act on.
IN_MEMORY_DATASETS = ("digits", "cifar10")


class BadImageError(WorkbookError, RuntimeError):
    """An image that cannot be decoded; the message names the file and the fix."""


# Modes holding more than 8 bits per channel, which PIL's convert("RGB") clips to 255 (white)
# instead of scaling: a 16-bit PNG opens as I;16 or as I (32-bit integers holding 0-65535).
SIXTEEN_BIT_MODES = ("I;16", "I;16B", "I;16L", "I;16N", "I")


def to_rgb(image: Image.Image) -> Image.Image:
    """`image` as 8-bit RGB; 16-bit grey is scaled (0-65535 to 0-255, rounded) rather than clipped."""
    if image.mode not in SIXTEEN_BIT_MODES:
        return image.convert("RGB")
    pixels = np.asarray(image).astype(np.int64)
    if pixels.min(initial=0) < 0 or pixels.max(initial=0) > 65535:
        raise ValueError(f"mode {image.mode} with values outside 0-65535 (a 32-bit image); convert it to 8 bits")
    grey = ((pixels * 255 + 32767) // 65535).astype(np.uint8)  # 65535 -> 255, 257 -> 1: round(v / 257)
    return Image.fromarray(grey, "L").convert("RGB")


def load_rgb(path: str | os.PathLike) -> Image.Image:
    """Open an image as RGB (16-bit scaled to 8, see `to_rgb`), turning any decode failure into a
    BadImageError with the path."""
    try:
        with Image.open(path) as image:
            return to_rgb(image)
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise BadImageError(f"{path}: cannot decode image ({error}); remove or replace it, "
                            "or set bad_images=skip") from None


def list_image_folder(root: Path, *, follow_links: bool = False,
                      bad_images: str = "fail") -> tuple[list[str], list[tuple[str, int]]]:
    """(classes, samples) of an ImageFolder tree in torchvision's order (sorted class folders, then
    sorted folders and files in each), agreeing with `workbook scan`: links to folders inside a
    class folder are not followed unless `follow_links` (then each real folder once, so a link to
    an ancestor ends); a broken or looping file link raises BadImageError (bad_images=fail) or is
    left out with a warning (skip). torchvision's own walk follows every folder link, forever."""
    from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes

    classes, class_to_index = find_classes(str(root))
    samples = []
    for name in classes:
        folders, visited = [], set()
        for folder, subfolders, files in os.walk(root / name, followlinks=follow_links):
            real = os.path.realpath(folder)
            if real in visited:  # a link back to a folder already walked
                subfolders[:] = []
                continue
            visited.add(real)
            subfolders.sort()  # which link reaches a real folder first must not depend on listing order
            if not follow_links:
                for linked in (d for d in subfolders if os.path.islink(os.path.join(folder, d))):
                    log.warning("not following the folder link %s (class %s); copy the images in, or pass "
                                "follow_links=True (`workbook scan` counts what it would add)",
                                os.path.join(folder, linked), name)
            folders.append((folder, files))
        for folder, files in sorted(folders):
            for file_name in sorted(files):
                path = os.path.join(folder, file_name)
                if not file_name.lower().endswith(IMG_EXTENSIONS):
                    continue
                if os.path.islink(path) and not os.path.isfile(path):  # isfile follows the link
                    message = (f"{path}: symbolic link to {os.readlink(path)}, which does not exist or loops back; "
                               "remove the link or restore its target (`workbook scan` lists every link)")
                    if bad_images == "fail":
                        raise BadImageError(message)
                    log.warning("skipping %s", message)
                    continue
                samples.append((path, class_to_index[name]))
    empty = sorted(set(classes) - {classes[target] for _, target in samples})
    if empty:  # torchvision's ImageFolder refuses these too (allow_empty=False)
        raise FileNotFoundError(f"no image files ({', '.join(IMG_EXTENSIONS)}) in the class folder(s) "
                                f"{', '.join(empty)} of {root}; add images or remove the folder")
    return classes, samples


class ImageFolderDataset:
    """torchvision's ImageFolder layout (one folder per class) with the workbook's bad-image policy
    and `list_image_folder`'s rules for links (what `workbook scan` reports is what loads).

    bad_images="fail" raises BadImageError naming the file (in a worker, the DataLoader
    re-raises it in the main process, so nothing hangs; `loaders.timed_batches` strips the worker's
    traceback from its message); "skip" logs the file once and returns the next readable sample
    instead. Skipped files are flagged in a shared-memory tensor, so `skipped` counts the files
    DataLoader workers left out too (each worker holds its own copy of the dataset).
    """

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
                    log.warning("skipping %s", error)
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
    """A subset of a dataset with its own transform (so train and val of one split differ)."""

    def __init__(self, dataset, indices, transform=None):
        self.dataset, self.indices, self.transform = dataset, list(indices), transform
        self.classes = dataset.classes
        targets = getattr(dataset, "targets", None)
        self.targets = [targets[i] for i in self.indices] if targets is not None else None

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, index):
        image, target = self.dataset[self.indices[index]]
        if isinstance(image, torch.Tensor):  # uint8 C x H x W from a FileDecoder or the pre-decoded cache
            return (self.transform(image) if self.transform else image), int(target)
        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image))
        image = image.convert("RGB")
        return (self.transform(image) if self.transform else image), int(target)


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


def split_indices(targets, fractions, seed):
    """Stratified split of range(len(targets)) into len(fractions) parts (scikit-learn)."""
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(targets))
    first, rest = train_test_split(indices, train_size=fractions[0], stratify=targets, random_state=seed)
    if len(fractions) == 2:
        return [first.tolist(), rest.tolist()]
    rest_targets = np.asarray(targets)[rest]
    second, third = train_test_split(rest, train_size=fractions[1] / (1 - fractions[0]),
                                     stratify=rest_targets, random_state=seed)
    return [first.tolist(), second.tolist(), third.tolist()]


def limit_indices(count: int, max_images: int, seed: int) -> list[int] | None:
    """Which `max_images` of `count` training images to keep (a seeded random choice, sorted),
    or None for all of them: the one rule for max_train_images, whatever the storage."""
    if not max_images or max_images >= count:
        return None
    return sorted(np.random.default_rng(seed).permutation(count)[:max_images].tolist())


def _limit(dataset, max_images: int, seed: int):
    keep = limit_indices(len(dataset), max_images, seed)
    return dataset if keep is None else _Subset(dataset, keep)


class _Subset(TransformedSubset):
    """A subset keeping the parent's transform."""

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]


def _refuse_file_switches(config: Config) -> None:
    """digits and CIFAR-10 are decoded arrays in memory: decoder and storage have nothing to act on."""
    for name, default in (("decoder", "pil"), ("storage", "files")):
        value = getattr(config, name)
        if value != default:
            raise ConfigError(f"{name}={value} does not apply to dataset={config.dataset}: its images are decoded "
                              f"arrays in memory; use {name}={default} (decoder and storage act on image folders: "
                              "landcover-synth, imagefolder, eurosat)")


def digits_bundle(config: Config) -> DataBundle:
    """scikit-learn's handwritten digits (1,797 real 8x8 scans), upscaled and split 70/15/15.
    Flips and crops would turn digits into other symbols: training is not augmented, wherever
    augmentation runs (with augmentation=device the device stage only normalises)."""
    from sklearn.datasets import load_digits

    from course_lib.data.pipeline import split_transforms

    digits = load_digits()
    pixels = (digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 grey levels -> 0..255
    images = np.repeat(pixels[..., None], 3, axis=-1)
    classes = [str(d) for d in digits.target_names]
    whole = ArrayImageDataset(images, digits.target, classes)
    tr, va, te = split_indices(digits.target, (0.7, 0.15, 0.15), config.seed)
    train_tf, eval_tf, stage = split_transforms(config, augment=False)
    return DataBundle(TransformedSubset(whole, tr, train_tf), TransformedSubset(whole, va, eval_tf),
                      TransformedSubset(whole, te, eval_tf), classes, "sklearn.datasets.load_digits", stage)


def eurosat_folder(root: Path, download: bool) -> Path:
    """torchvision.datasets.EuroSAT's image folder (root/eurosat/2750/<class>/*.jpg), downloaded
    when allowed; the workbook then reads it as an image folder, so every data switch applies."""
    from torchvision.datasets import EuroSAT

    try:
        EuroSAT(str(root), download=download)  # checks the files (and downloads them when allowed)
    except RuntimeError as error:
        raise FileNotFoundError(f"EuroSAT not found under {root} ({error}); set download=true when online, "
                                "or point dataset=imagefolder data_dir=... at an extracted copy") from None
    return Path(root) / "eurosat" / "2750"  # where torchvision.datasets.EuroSAT keeps the images


def cifar10_bundle(root: Path, config: Config) -> DataBundle:
    """torchvision.datasets.CIFAR10: its train set split 90/10 into train/val, its test set as test."""
    from torchvision.datasets import CIFAR10

    from course_lib.data.pipeline import split_transforms

    train_tf, eval_tf, stage = split_transforms(config)
    try:
        train_whole = CIFAR10(str(root), train=True, download=config.download)
        test = CIFAR10(str(root), train=False, download=config.download, transform=eval_tf)
    except RuntimeError as error:
        raise FileNotFoundError(f"CIFAR-10 not found under {root} ({error}); set download=true when online") from None
    tr, va = split_indices(train_whole.targets, (0.9, 0.1), config.seed)
    return DataBundle(TransformedSubset(train_whole, tr, train_tf), TransformedSubset(train_whole, va, eval_tf),
                      test, list(train_whole.classes), str(root), stage)


def build_datasets(config: Config) -> DataBundle:
    """The train/val/test datasets that `config.dataset` and `config.data_dir` name, read, decoded
    and augmented as `config.storage`, `config.decoder` and `config.augmentation` say (see
    `pipeline.py`); `bundle.pipeline` names the choices and `bundle.device_stage` finishes each
    batch on the training device."""
    from course_lib.data.pipeline import describe, image_folder_bundle

    name = config.dataset
    if name in IN_MEMORY_DATASETS:
        _refuse_file_switches(config)
    if name == "landcover-synth":
        root = resolve_path(config.data_dir) if config.data_dir else landcover_cache_dir(seed=0)
        return image_folder_bundle(root, config)
    if name == "imagefolder":
        if not config.data_dir:
            raise ConfigError("dataset=imagefolder needs data_dir=<folder with train/ and val/ subfolders>")
        return image_folder_bundle(resolve_path(config.data_dir), config)
    if name == "eurosat":
        root = resolve_path(config.data_dir or str(CACHE_DIR / "torchvision"))
        return image_folder_bundle(eurosat_folder(root, config.download), config, source=str(root))
    if name == "digits":
        bundle = digits_bundle(config)
    elif name == "cifar10":
        bundle = cifar10_bundle(resolve_path(config.data_dir or str(CACHE_DIR / "torchvision")), config)
    else:  # make_config already refuses other names
        raise ConfigError(f"unknown dataset {name!r}")
    bundle.train = _limit(bundle.train, config.max_train_images, config.seed)
    bundle.pipeline = describe(config)
    return bundle


def config_with_data(profile: str | None, *, find_real: bool = True, **values) -> tuple[Config, DataChoice]:
    """(Config, DataChoice) for `profile` and `values` (Config fields; None and "" for dataset or
    data_dir mean not given): the data `paths.choose_data` picks, under the values. `workbook train`,
    `data info`, `speedrun`, `ddp` and the notebooks build their configs here, so they agree on the data."""
    given = {name: value for name, value in values.items()
             if value is not None and not (name in ("dataset", "data_dir") and value == "")}
    choice = choose_data(resolve_profile(profile), given.get("data_dir"), given.get("dataset"), find_real=find_real)
    return make_config(profile, **{**choice.overrides, **given}), choice


def image_folder_root(config: Config) -> Path:
    """The folder an image-folder config reads (data_dir, or the generated landcover-synth, made on
    first use), for code that reads the files itself, such as notebook 12's hand-written loop."""
    if config.data_dir:
        return resolve_path(config.data_dir)
    if config.dataset == "landcover-synth":
        return landcover_cache_dir(seed=0)
    raise ConfigError(f"dataset={config.dataset} is not an image folder; set data_dir=<folder with train/ and valid/> "
                      "(workbook bench: or pass --folder)")


def sample_grid(dataset, classes, per_class: int = 6, seed: int = 0):
    """A matplotlib figure: one row per class, `per_class` images each (denormalized)."""
    import matplotlib.pyplot as plt

    targets = np.asarray(dataset.targets if getattr(dataset, "targets", None) is not None
                         else [dataset[i][1] for i in range(len(dataset))])
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
