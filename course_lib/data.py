"""Datasets for the workbook: the generated `landcover-synth` set, scikit-learn's digits,
any ImageFolder directory (EuroSAT RGB among them), and torchvision's EuroSAT and CIFAR-10
classes; plus the transforms they share and `scan`, a checker for image folders.

EuroSAT: Helber et al., "EuroSAT: A Novel Dataset and Deep Learning Benchmark for Land
Use and Land Cover Classification", IEEE JSTARS 2019. CIFAR-10: Krizhevsky, 2009.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
from pathlib import Path

import numpy as np
from PIL import Image, ImageFile

from course_lib.config import Config, ConfigError, WorkbookError
from course_lib.ledger import project_root

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
# ImageNet statistics: what timm's pretrained CNNs expect (timm.data.IMAGENET_DEFAULT_MEAN/STD).
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402

# ---------------------------------------------------------------------------------------------
# landcover-synth: a generated remote-sensing-like set with deliberately confusable pairs
# ---------------------------------------------------------------------------------------------

LANDCOVER_CLASSES = ("bare_soil", "farmland", "forest", "grassland", "industrial", "residential",
                     "road", "water")
# Pairs drawn from overlapping parameter ranges, so a confusion matrix has structure to find.
LANDCOVER_CONFUSABLE = (("forest", "grassland"), ("residential", "industrial"), ("farmland", "bare_soil"))
SPLITS = ("train", "val", "test")
SAMPLE_DIR = Path("data_samples") / "landcover-synth"
CACHE_DIR = Path("data_cache")


def _smooth_noise(rng: np.random.Generator, size: int, cells: int) -> np.ndarray:
    """Value noise in [-1, 1]: a `cells` x `cells` random grid upsampled bicubically to `size`."""
    grid = rng.uniform(-1, 1, (max(2, cells), max(2, cells))).astype(np.float32)
    return np.asarray(Image.fromarray(grid, mode="F").resize((size, size), Image.BICUBIC))


def _rotated_coordinates(rng: np.random.Generator, size: int):
    """Pixel coordinates in a frame rotated by a random angle (for stripes and grids)."""
    angle = rng.uniform(0, np.pi)
    y, x = np.mgrid[0:size, 0:size].astype(np.float32) / size
    return x * np.cos(angle) + y * np.sin(angle), -x * np.sin(angle) + y * np.cos(angle)


def _colour(base, rng, jitter=12.0):
    return np.asarray(base, np.float32) + rng.normal(0, jitter, 3)


def _paint(rng, size, base, noise_cells, amplitude):
    """A base colour with luminance texture: the ground every class starts from."""
    texture = _smooth_noise(rng, size, noise_cells)[..., None]
    return _colour(base, rng) + amplitude * texture


def _vegetation(rng, size, green, cells_range):
    cells = int(rng.uniform(*cells_range) * size / 64)
    image = _paint(rng, size, (green * 0.45, green, green * 0.4), cells, 30)
    return image + 12 * _smooth_noise(rng, size, max(2, cells * 3))[..., None]


def _blocks(rng, size, block_fraction, roof_colours, ground):
    """A grid of rectangular buildings; block size is a fraction of the image side."""
    image = _paint(rng, size, ground, max(2, size // 16), 14)
    u, v = _rotated_coordinates(rng, size)
    period = block_fraction
    fill = rng.uniform(0.5, 0.8)
    cell_u, cell_v = np.floor(u / period), np.floor(v / period)
    inside = ((u / period) % 1 < fill) & ((v / period) % 1 < fill)
    roof_index = ((cell_u * 7 + cell_v * 13) % len(roof_colours)).astype(int)
    roofs = np.asarray(roof_colours, np.float32)[roof_index] + rng.normal(0, 10, 3)
    return np.where(inside[..., None], roofs, image)


def _landcover_image(name: str, rng: np.random.Generator, size: int) -> np.ndarray:
    if name == "water":
        image = _paint(rng, size, (25, 55, 95), max(2, size // 32), 10)
    elif name == "forest":  # coarse, dark canopy; overlaps grassland in brightness
        image = _vegetation(rng, size, rng.uniform(70, 105), (6, 12))
    elif name == "grassland":  # finer, lighter texture
        image = _vegetation(rng, size, rng.uniform(90, 125), (3, 8))
    elif name in ("farmland", "bare_soil"):
        soil = (rng.uniform(130, 160), rng.uniform(105, 130), rng.uniform(75, 95))
        image = _paint(rng, size, soil, max(2, size // 16), 16)
        if name == "farmland":  # stripes of crop; low-contrast ones look like bare soil
            u, _ = _rotated_coordinates(rng, size)
            stripes = np.sin(2 * np.pi * u * rng.uniform(4, 10))[..., None]
            crop = np.asarray((80, 115, 55), np.float32)
            contrast = rng.uniform(0.15, 0.7)
            image = image + contrast * (stripes > 0) * (crop - image)
    elif name == "residential":  # small, mixed roofs
        image = _blocks(rng, size, rng.uniform(0.08, 0.16), [(150, 70, 60), (120, 120, 125), (170, 150, 130)],
                        (95, 110, 80))
    elif name == "industrial":  # larger, pale roofs; small ones overlap residential
        image = _blocks(rng, size, rng.uniform(0.14, 0.3), [(190, 190, 195), (150, 155, 160), (120, 130, 150)],
                        (120, 115, 105))
    elif name == "road":
        ground = (rng.uniform(90, 140), rng.uniform(100, 130), rng.uniform(60, 90))
        image = _paint(rng, size, ground, max(2, size // 16), 18)
        u, _ = _rotated_coordinates(rng, size)
        centre, width = rng.uniform(0.3, 0.7), rng.uniform(0.04, 0.09)
        road = np.abs(u - (u.min() + centre * (u.max() - u.min()))) < width
        image = np.where(road[..., None], _colour((115, 115, 115), rng, 8), image)
    else:
        raise ConfigError(f"unknown landcover class {name!r}; valid: {', '.join(LANDCOVER_CLASSES)}")
    image = image + rng.normal(0, 4, image.shape)  # sensor noise
    return np.clip(image, 0, 255).astype(np.uint8)


def landcover_image(name: str, index: int, size: int = 64, seed: int = 0, split: str = "train") -> np.ndarray:
    """One deterministic landcover-synth image (H x W x 3 uint8) for class `name`."""
    rng = np.random.default_rng([seed, SPLITS.index(split), LANDCOVER_CLASSES.index(name), index])
    return _landcover_image(name, rng, size)


def make_landcover(out_dir: str | os.PathLike, image_size: int = 64, per_class: dict | None = None,
                   seed: int = 0, jpeg_quality: int = 90) -> Path:
    """Write landcover-synth as JPEG in ImageFolder layout: out_dir/{train,val,test}/<class>/<n>.jpg.

    `per_class` maps split to images per class (default 200/50/50). Deterministic from `seed`.
    Writes into a temporary folder first and renames it, so an interrupted run leaves nothing
    half-written behind.
    """
    if not 16 <= image_size <= 1024:
        raise ConfigError(f"image_size={image_size} is outside 16..1024 pixels")
    per_class = per_class or {"train": 200, "val": 50, "test": 50}
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; remove it or choose another --out")
    staging = out_dir.with_name(out_dir.name + ".partial")
    if staging.exists():
        import shutil

        shutil.rmtree(staging)
    for split, count in per_class.items():
        for name in LANDCOVER_CLASSES:
            folder = staging / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for index in range(count):
                pixels = landcover_image(name, index, image_size, seed, split)
                Image.fromarray(pixels).save(folder / f"{name}_{index:05d}.jpg", quality=jpeg_quality)
    (staging / "dataset.json").write_text(json.dumps({
        "name": "landcover-synth", "image_size": image_size, "per_class": per_class, "seed": seed,
        "classes": LANDCOVER_CLASSES, "confusable_pairs": LANDCOVER_CONFUSABLE}, indent=2))
    staging.rename(out_dir)
    return out_dir


def landcover_cache_dir(image_size: int = 64, per_class: dict | None = None, seed: int = 0) -> Path:
    """The cache folder for a landcover-synth variant; generated on first use."""
    per_class = per_class or {"train": 200, "val": 50, "test": 50}
    counts = "-".join(str(per_class[s]) for s in SPLITS if s in per_class)
    folder = project_root() / CACHE_DIR / f"landcover-synth-{image_size}px-{counts}-seed{seed}"
    if not folder.exists():
        log.info("generating %s (first use)", folder)
        try:
            make_landcover(folder, image_size, per_class, seed)
        except FileExistsError:  # another process finished it first
            pass
    return folder


# ---------------------------------------------------------------------------------------------
# Loading images: fail fast naming the file, or skip it
# ---------------------------------------------------------------------------------------------

class BadImageError(WorkbookError, RuntimeError):
    """An image that cannot be decoded; the message names the file and the fix."""


def load_rgb(path: str | os.PathLike) -> Image.Image:
    """Open an image as RGB, turning any decode failure into a BadImageError with the path."""
    try:
        with Image.open(path) as image:
            return image.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as error:
        raise BadImageError(f"{path}: cannot decode image ({error}); remove or replace it, "
                            "or set bad_images=skip") from None


class ImageFolderDataset:
    """torchvision's ImageFolder with the workbook's bad-image policy.

    bad_images="fail" raises BadImageError naming the file (in a worker, the DataLoader
    re-raises it in the main process, so nothing hangs); "skip" logs the file once and
    returns the next readable sample instead.
    """

    def __init__(self, root: str | os.PathLike, transform=None, bad_images: str = "fail", loader=None):
        from torchvision.datasets import ImageFolder

        root = Path(root)
        if not root.is_dir():
            raise FileNotFoundError(f"image folder {root} does not exist; check data_dir "
                                    "(or run `workbook data make` to generate one)")
        self.folder = ImageFolder(str(root), loader=load_rgb, allow_empty=False)
        # loader: path -> image, raising BadImageError (e.g. decode.FileDecoder("opencv")); picklable.
        self.loader = loader or load_rgb
        self.transform = transform
        self.bad_images = bad_images
        self.classes = self.folder.classes
        self.samples = self.folder.samples
        self.targets = self.folder.targets
        self.skipped: set[str] = set()

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        for attempt in range(len(self.samples)):
            path, target = self.samples[(index + attempt) % len(self.samples)]
            try:
                image = self.loader(path)
            except BadImageError as error:
                if self.bad_images == "fail":
                    raise
                if path not in self.skipped:
                    self.skipped.add(path)
                    log.warning("skipping %s", error)
                continue
            return (self.transform(image) if self.transform else image), target
        raise BadImageError(f"no readable image in {Path(self.samples[0][0]).parents[1]}")


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
        if not isinstance(image, Image.Image):
            image = Image.fromarray(np.asarray(image)).convert("RGB")
        return (self.transform(image.convert("RGB")) if self.transform else image), int(target)


# ---------------------------------------------------------------------------------------------
# Transforms
# ---------------------------------------------------------------------------------------------

def train_transform(image_size: int):
    """Light CPU augmentation (the articles' default): random resized crop and flip."""
    import torch
    from torchvision.transforms import v2

    return v2.Compose([
        v2.ToImage(),
        v2.RandomResizedCrop(image_size, scale=(0.6, 1.0), antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    ])


def eval_transform(image_size: int):
    import torch
    from torchvision.transforms import v2

    return v2.Compose([
        v2.ToImage(),
        v2.Resize((image_size, image_size), antialias=True),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    ])


def denormalize(batch):
    """Undo Normalize for display: a float tensor in [0, 1]."""
    import torch

    mean = torch.tensor(IMAGENET_DEFAULT_MEAN, device=batch.device).view(-1, 1, 1)
    std = torch.tensor(IMAGENET_DEFAULT_STD, device=batch.device).view(-1, 1, 1)
    return (batch * std + mean).clamp(0, 1)


# ---------------------------------------------------------------------------------------------
# Building the datasets a config names
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class DataBundle:
    train: object
    val: object
    test: object
    classes: list
    source: str  # where the images came from, for reports

    @property
    def num_classes(self) -> int:
        return len(self.classes)


def resolve_path(path: str) -> Path:
    """Relative paths are relative to the project root, so notebooks (run from notebooks/)
    and the CLI agree."""
    candidate = Path(path).expanduser()
    return candidate if candidate.is_absolute() else project_root() / candidate


def _split_indices(targets, fractions, seed):
    """Stratified split of range(len(targets)) into len(fractions) parts (scikit-learn)."""
    from sklearn.model_selection import train_test_split

    indices = np.arange(len(targets))
    first, rest = train_test_split(indices, train_size=fractions[0], stratify=targets, random_state=seed)
    if len(fractions) == 2:
        return [first, rest]
    rest_targets = np.asarray(targets)[rest]
    second, third = train_test_split(rest, train_size=fractions[1] / (1 - fractions[0]),
                                     stratify=rest_targets, random_state=seed)
    return [first, second, third]


def _limit(dataset, max_images: int, seed: int):
    if not max_images or max_images >= len(dataset):
        return dataset
    keep = np.random.default_rng(seed).permutation(len(dataset))[:max_images]
    return _Subset(dataset, sorted(keep.tolist()))


class _Subset(TransformedSubset):
    """A subset keeping the parent's transform."""

    def __getitem__(self, index):
        return self.dataset[self.indices[index]]


def _split_folder_names(root: Path) -> dict:
    names = {"train": ("train",), "val": ("val", "valid", "validation"), "test": ("test",)}
    found = {}
    for split, options in names.items():
        for option in options:
            if (root / option).is_dir():
                found[split] = root / option
                break
    return found


def imagefolder_bundle(root: Path, image_size: int, bad_images: str, seed: int) -> DataBundle:
    """train/ val|valid/ test/ subfolders when present; otherwise a seeded 80/10/10 split."""
    splits = _split_folder_names(root)
    train_tf, eval_tf = train_transform(image_size), eval_transform(image_size)
    if "train" in splits:
        train = ImageFolderDataset(splits["train"], train_tf, bad_images)
        val = ImageFolderDataset(splits["val"], eval_tf, bad_images) if "val" in splits else None
        test = ImageFolderDataset(splits["test"], eval_tf, bad_images) if "test" in splits else None
        if val is None:  # carve a validation split out of train
            whole = ImageFolderDataset(splits["train"], None, bad_images)
            tr, va = _split_indices(whole.targets, (0.9, 0.1), seed)
            train, val = TransformedSubset(whole, tr, train_tf), TransformedSubset(whole, va, eval_tf)
        return DataBundle(train, val, test, list(train.classes), str(root))
    whole = ImageFolderDataset(root, None, bad_images)
    tr, va, te = _split_indices(whole.targets, (0.8, 0.1, 0.1), seed)
    return DataBundle(TransformedSubset(whole, tr, train_tf), TransformedSubset(whole, va, eval_tf),
                      TransformedSubset(whole, te, eval_tf), list(whole.classes), str(root))


def digits_bundle(image_size: int, seed: int) -> DataBundle:
    """scikit-learn's handwritten digits (1,797 real 8x8 scans), upscaled and split 70/15/15."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = (digits.images * (255.0 / 16.0)).astype(np.uint8)  # 0..16 grey levels -> 0..255
    images = np.repeat(pixels[..., None], 3, axis=-1)
    classes = [str(d) for d in digits.target_names]
    whole = ArrayImageDataset(images, digits.target, classes)
    tr, va, te = _split_indices(digits.target, (0.7, 0.15, 0.15), seed)
    # Flips would turn digits into other symbols: evaluation transform for training too.
    tf = eval_transform(image_size)
    return DataBundle(TransformedSubset(whole, tr, tf), TransformedSubset(whole, va, tf),
                      TransformedSubset(whole, te, tf), classes, "sklearn.datasets.load_digits")


def eurosat_bundle(root: Path, image_size: int, download: bool, seed: int) -> DataBundle:
    """torchvision.datasets.EuroSAT (expects root/eurosat/2750/<class>/*.jpg), split 80/10/10."""
    from torchvision.datasets import EuroSAT

    try:
        whole = EuroSAT(str(root), download=download)
    except RuntimeError as error:
        raise FileNotFoundError(f"EuroSAT not found under {root} ({error}); set download=true when online, "
                                "or point dataset=imagefolder data_dir=... at an extracted copy") from None
    tr, va, te = _split_indices(whole.targets, (0.8, 0.1, 0.1), seed)
    return DataBundle(TransformedSubset(whole, tr, train_transform(image_size)),
                      TransformedSubset(whole, va, eval_transform(image_size)),
                      TransformedSubset(whole, te, eval_transform(image_size)), list(whole.classes), str(root))


def cifar10_bundle(root: Path, image_size: int, download: bool, seed: int) -> DataBundle:
    """torchvision.datasets.CIFAR10: its train set split 90/10 into train/val, its test set as test."""
    from torchvision.datasets import CIFAR10

    try:
        train_whole = CIFAR10(str(root), train=True, download=download)
        test = CIFAR10(str(root), train=False, download=download, transform=eval_transform(image_size))
    except RuntimeError as error:
        raise FileNotFoundError(f"CIFAR-10 not found under {root} ({error}); set download=true when online") from None
    tr, va = _split_indices(train_whole.targets, (0.9, 0.1), seed)
    return DataBundle(TransformedSubset(train_whole, tr, train_transform(image_size)),
                      TransformedSubset(train_whole, va, eval_transform(image_size)),
                      test, list(train_whole.classes), str(root))


def build_datasets(config: Config) -> DataBundle:
    """The train/val/test datasets that `config.dataset` and `config.data_dir` name."""
    name = config.dataset
    if name == "landcover-synth":
        root = resolve_path(config.data_dir) if config.data_dir else landcover_cache_dir(seed=0)
        bundle = imagefolder_bundle(root, config.image_size, config.bad_images, config.seed)
    elif name == "digits":
        bundle = digits_bundle(config.image_size, config.seed)
    elif name == "imagefolder":
        if not config.data_dir:
            raise ConfigError("dataset=imagefolder needs data_dir=<folder with train/ and val/ subfolders>")
        bundle = imagefolder_bundle(resolve_path(config.data_dir), config.image_size, config.bad_images,
                                    config.seed)
    elif name == "eurosat":
        bundle = eurosat_bundle(resolve_path(config.data_dir or str(CACHE_DIR / "torchvision")),
                                config.image_size, config.download, config.seed)
    elif name == "cifar10":
        bundle = cifar10_bundle(resolve_path(config.data_dir or str(CACHE_DIR / "torchvision")),
                                config.image_size, config.download, config.seed)
    else:  # make_config already refuses other names
        raise ConfigError(f"unknown dataset {name!r}")
    bundle.train = _limit(bundle.train, config.max_train_images, config.seed)
    return bundle


def eurosat_shared_dir() -> Path | None:
    """The real EuroSAT RGB folder beside the project (../shared/datasets/eurosat_rgb), if present."""
    candidate = project_root().parent / "shared" / "datasets" / "eurosat_rgb"
    return candidate if (candidate / "train").is_dir() else None


# ---------------------------------------------------------------------------------------------
# scan: check an image folder without crashing
# ---------------------------------------------------------------------------------------------

_FORMAT_EXTENSIONS = {"JPEG": (".jpg", ".jpeg"), "PNG": (".png",), "BMP": (".bmp",), "WEBP": (".webp",),
                      "TIFF": (".tif", ".tiff"), "GIF": (".gif",)}
_USUAL_MODES = ("RGB", "L")


@dataclasses.dataclass
class ScanProblem:
    path: str
    kind: str  # zero-byte | unreadable | truncated | wrong-extension | unusual-mode | not-an-image
    detail: str

    def __str__(self):
        return f"{self.path}: {self.kind}: {self.detail}"


def scan_file(path: Path) -> list[ScanProblem]:
    """Problems with one file (empty list when it is a clean image)."""
    if path.stat().st_size == 0:
        return [ScanProblem(str(path), "zero-byte", "file is empty; delete it or restore it from the source")]
    problems = []
    try:
        with Image.open(path) as image:
            image_format, mode = image.format, image.mode
            image.load()  # full decode: catches truncation that open() alone does not
    except OSError as error:
        kind = "truncated" if "truncated" in str(error).lower() else "unreadable"
        if isinstance(error, Image.UnidentifiedImageError):
            kind = "unreadable" if path.suffix.lower() in IMAGE_EXTENSIONS else "not-an-image"
        return [ScanProblem(str(path), kind, f"{error}; re-export or remove it")]
    except (ValueError, SyntaxError, Image.DecompressionBombError) as error:
        return [ScanProblem(str(path), "unreadable", f"{error}; re-export or remove it")]
    expected = _FORMAT_EXTENSIONS.get(image_format, ())
    if expected and path.suffix.lower() not in expected:
        problems.append(ScanProblem(str(path), "wrong-extension",
                                    f"contents are {image_format} but the name ends {path.suffix or '(none)'}; "
                                    f"rename it to {expected[0]}"))
    if mode not in _USUAL_MODES:
        problems.append(ScanProblem(str(path), "unusual-mode",
                                    f"mode {mode} (loaders convert to RGB; check colours/alpha are as intended)"))
    return problems


def scan_folder(root: str | os.PathLike) -> tuple[int, list[ScanProblem]]:
    """Scan every file under `root`; returns (files checked, problems)."""
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root} is not a folder; give the folder that holds the images")
    checked, problems = 0, []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.name.startswith(".") or path.suffix.lower() in (".json", ".txt", ".md", ".csv"):
            continue
        checked += 1
        problems.extend(scan_file(path))
    return checked, problems


# ---------------------------------------------------------------------------------------------
# CLI: `workbook data make`, `workbook data info`, `workbook scan`
# ---------------------------------------------------------------------------------------------

def add_cli(subparsers) -> None:
    data = subparsers.add_parser("data", help="generate or describe datasets")
    actions = data.add_subparsers(dest="action", metavar="ACTION", required=True)
    make = actions.add_parser("make", help="write landcover-synth as JPEG in ImageFolder layout")
    make.add_argument("--out", required=True, help="folder to create (must not exist)")
    make.add_argument("--image-size", type=int, default=64, help="pixels per side (16..1024)")
    make.add_argument("--train", type=int, default=200, help="training images per class")
    make.add_argument("--val", type=int, default=50, help="validation images per class")
    make.add_argument("--test", type=int, default=50, help="test images per class")
    make.add_argument("--seed", type=int, default=0)
    make.set_defaults(func=_cli_make)
    info = actions.add_parser("info", help="classes and split sizes of a configured dataset")
    info.add_argument("--profile", default="auto")
    info.add_argument("-p", "--param", action="append", default=[], metavar="NAME=VALUE")
    info.set_defaults(func=_cli_info)

    scan = subparsers.add_parser("scan", help="check an image folder for unreadable or odd files")
    scan.add_argument("folder")
    scan.set_defaults(func=_cli_scan)


def _cli_make(args) -> int:
    out = make_landcover(args.out, args.image_size, {"train": args.train, "val": args.val, "test": args.test},
                         args.seed)
    total = sum(1 for _ in out.rglob("*.jpg"))
    size = sum(p.stat().st_size for p in out.rglob("*.jpg"))
    print(f"wrote {total} images ({size / 1e6:.1f} MB) to {out}")
    return 0


def _cli_info(args) -> int:
    from course_lib.config import make_config, parse_assignments

    config = make_config(args.profile, **parse_assignments(args.param))
    bundle = build_datasets(config)
    sizes = {s: len(getattr(bundle, s)) if getattr(bundle, s) is not None else 0 for s in SPLITS}
    print(f"{config.dataset} from {bundle.source}: {bundle.num_classes} classes {bundle.classes}; sizes {sizes}")
    return 0


def _cli_scan(args) -> int:
    checked, problems = scan_folder(args.folder)
    for problem in problems:
        print(problem)
    print(f"checked {checked} files: {len(problems)} problem(s)")
    return 1 if problems else 0


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
                axis.imshow(denormalize(image).permute(1, 2, 0).numpy())
        axes[row, 0].set_title(name, fontsize=8, loc="left")
    figure.tight_layout()
    return figure
