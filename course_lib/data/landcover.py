"""landcover-synth: a generated remote-sensing-like dataset (eight land-cover classes, three
deliberately confusable pairs), deterministic from a seed at any size from 16 to 1024 px, written
as JPEG in ImageFolder layout. The committed sample and the cached larger copy come from here.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from course_lib.config import ConfigError
from course_lib.paths import CACHE_DIR, project_root

SPLITS = ("train", "val", "test")
log = logging.getLogger(__name__)
LANDCOVER_CLASSES = ("bare_soil", "farmland", "forest", "grassland", "industrial", "residential",
                     "road", "water")
# Pairs drawn from overlapping parameter ranges, so a confusion matrix has structure to find.
LANDCOVER_CONFUSABLE = (("forest", "grassland"), ("residential", "industrial"), ("farmland", "bare_soil"))


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


def _blocks(rng, size, period, roof_colours, ground):
    """A grid of rectangular buildings; `period`, the block size, is a fraction of the image side."""
    image = _paint(rng, size, ground, max(2, size // 16), 14)
    u, v = _rotated_coordinates(rng, size)
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
    """Write landcover-synth as JPEG in ImageFolder layout, out_dir/{train,val,test}/<class>/<n>.jpg, `per_class`
    images per class and split (default 200/50/50; 0: no folder, as the loader refuses empty class folders), into a
    temporary folder renamed when whole, so an interrupted run leaves nothing half-written."""
    if not 16 <= image_size <= 1024:
        raise ConfigError(f"image_size={image_size} is outside 16..1024 pixels")
    per_class = per_class or {"train": 200, "val": 50, "test": 50}
    if per_class.get("train", 0) < 1 or min(per_class.values()) < 0:
        shown = ", ".join(f"{split}={count}" for split, count in per_class.items())
        raise ConfigError(f"images per class {shown}: train needs at least 1, val and test 0 or more "
                          "(0 writes no folder for that split)")
    out_dir = Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} already exists; remove it or choose another --out")
    staging = out_dir.with_name(out_dir.name + ".partial")
    if staging.exists():
        shutil.rmtree(staging)
    for split, count in per_class.items():
        for name in LANDCOVER_CLASSES if count else ():  # no images: no empty folders for the loader to refuse
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
