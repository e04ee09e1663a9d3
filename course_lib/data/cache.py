"""Pre-decoded image cache: decode an image folder once into one uint8 array file
(N x H x W x 3, read back through `numpy.memmap`) and train from it, so no epoch pays for JPEG
decoding again. The article: "decode in advance and cache raw pixels ... costs disk space".
Docs: https://numpy.org/doc/stable/reference/generated/numpy.memmap.html
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from course_lib.data.build_lock import allocate, built_in_staging, damaged, exclusive_build
from course_lib.instruments.timing import now
from course_lib.paths import CACHE_DIR, project_root

log = logging.getLogger(__name__)
PIXELS_FILE = "images.uint8"  # raw N x H x W x 3 bytes, no header
LABELS_FILE = "labels.npy"
META_FILE = "cache.json"
CONTENT_KEY_PREFIX = "c-"  # tells a `content_key` from the path-only keys of shard sets written before it


@dataclasses.dataclass
class CacheInfo:
    folder: Path
    images: int
    image_size: int  # pixels per side
    classes: list
    source: str
    pixel_bytes: int  # size of the pixel file on disk
    source_bytes: int  # size of the encoded files it came from
    build_seconds: float
    skipped: list  # files left out (bad_images=skip)
    content_key: str = ""  # `content_key` of the files it holds; "": built before the key existed

    @property
    def disk_ratio(self) -> float:
        """How many times more disk the raw pixels take than the JPEGs."""
        return self.pixel_bytes / self.source_bytes if self.source_bytes else float("nan")


def default_cache_dir(source: str | os.PathLike, image_size: int, max_images: int = 0, selection: str = "") -> Path:
    """data_cache/predecoded/<folder name>-<size>px-<hash of the source path, max_images and
    `selection` (e.g. the decoder and the list of files, so different choices never collide)>."""
    text = f"{Path(source).resolve()}|{max_images}" + (f"|{selection}" if selection else "")
    digest = hashlib.sha1(text.encode()).hexdigest()[:8]
    return project_root() / CACHE_DIR / "predecoded" / f"{Path(source).name}-{image_size}px-{digest}"


def remove_caches(root: str | os.PathLike, image_size: int) -> int:
    """Delete the pre-decoded caches at `image_size` of the image folder `root` and of its split folders, so the
    next run decodes again (a benchmark whose clock must include decoding). Returns how many were removed."""
    names = {Path(root).name} | {child.name for child in Path(root).iterdir() if child.is_dir()} \
        if Path(root).is_dir() else set()
    removed = 0
    for folder in (project_root() / CACHE_DIR / "predecoded").glob(f"*-{image_size}px-*"):
        if folder.is_dir() and folder.name.rsplit(f"-{image_size}px-", 1)[0] in names:
            shutil.rmtree(folder)
            removed += 1
    return removed


def selection_key(folder, indices, extra: str = "") -> str:
    """A short hash of which files of the ImageFolderDataset `folder` were chosen (relative paths, in order) plus
    `extra`: it names a cache or shard set's folder (what the files hold is `content_key`'s)."""
    root = Path(folder.root)
    digest = hashlib.sha1(extra.encode())
    for index in indices:
        digest.update(b"\n" + os.path.relpath(folder.samples[index][0], root).encode())
    return digest.hexdigest()[:16]


def content_key(folder, indices, extra: str = "") -> str:
    """A short hash of all the cached pixels and labels depend on: each chosen file's relative path, class (index
    and name), size and modification time (ns, as make compares files), plus `extra`; an image edited in place or
    class folders swapped change it, so a cache or shard set of the old files is rebuilt, never trained on."""
    root = Path(folder.root)
    digest = hashlib.sha1(extra.encode())
    for index in indices:
        path, target = folder.samples[index][:2]
        try:
            stat = os.stat(path)
            size, modified = stat.st_size, stat.st_mtime_ns
        except OSError:  # gone or unreadable: decoding will name it
            size = modified = -1
        digest.update(f"\n{os.path.relpath(path, root)}|{target}|{folder.classes[target]}|{size}|{modified}".encode())
    return CONTENT_KEY_PREFIX + digest.hexdigest()[:16]


def changed_line(kind: str, folder: Path, built_with: str) -> str:
    """The one line a rebuild of a stale cache or shard set prints (`built_with`: the key it was built with)."""
    why = ("it was built before its key covered the files' sizes, dates and classes"
           if not built_with.startswith(CONTENT_KEY_PREFIX) else
           "an image was added, removed, edited or replaced in place, or a class folder renamed, since it was built")
    return f"{kind} {folder}: {why}; rebuilding it from the files as they are now"


def _read_info(folder: Path) -> CacheInfo:
    try:
        meta = json.loads((folder / META_FILE).read_text())
        return CacheInfo(folder=folder, **{k: v for k, v in meta.items() if k != "folder"})
    except (ValueError, TypeError) as error:  # cut-short JSON, or fields that are not a CacheInfo's
        raise damaged(folder, f"{META_FILE} is unreadable: {str(error).splitlines()[0][:80]}") from None


def verified_labels(folder: Path, info: CacheInfo) -> np.ndarray:
    """The cache's labels, after checking what reuse would otherwise take on trust: the pixel file holds exactly
    `images` rows, and there is one label per row, each a class index. Raises DamagedCacheError."""
    expected = info.images * info.image_size * info.image_size * 3
    try:
        actual = (folder / PIXELS_FILE).stat().st_size
    except OSError as error:
        raise damaged(folder, f"{PIXELS_FILE}: {error.strerror}") from None
    if actual != expected:
        raise damaged(folder, f"{PIXELS_FILE} holds {actual:,} bytes, not the {expected:,} of {info.images} images "
                              f"at {info.image_size} px")
    try:
        labels = np.load(folder / LABELS_FILE, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        raise damaged(folder, f"{LABELS_FILE} is unreadable: {str(error).splitlines()[0][:80]}") from None
    if labels.shape != (info.images,):
        raise damaged(folder, f"{LABELS_FILE} holds {labels.size} labels for {info.images} images")
    if len(labels) and not (0 <= labels.min() and labels.max() < len(info.classes)):
        raise damaged(folder, f"a label is outside 0..{len(info.classes) - 1}, the {len(info.classes)} classes")
    return labels


def build_cache(source: str | os.PathLike, image_size: int, out_dir: str | os.PathLike | None = None, *,
                decoder: str = "pil", bad_images: str = "fail", num_workers: int = 0, max_images: int = 0,
                indices: list[int] | None = None, rebuild: bool = False) -> CacheInfo:
    """Decode the ImageFolder `source`'s files (`indices`, else `max_images` spread evenly, 0 = all), resized to
    image_size, into `out_dir`, or return the cache already built there. Built in a staging folder and renamed,
    under a lock, so an interrupted or concurrent build leaves no half cache behind."""
    from course_lib.data import transforms
    from course_lib.data.datasets import ImageFolderDataset
    from course_lib.data.decode import FileDecoder

    out_dir = Path(out_dir) if out_dir else default_cache_dir(source, image_size, max_images)
    with exclusive_build(out_dir):
        start = now()
        dataset = ImageFolderDataset(source, transforms.sample_transform(image_size, "device"), bad_images,
                                     loader=FileDecoder(decoder))
        if indices is None:
            indices = list(range(len(dataset)))
            if max_images and max_images < len(indices):  # evenly spread, so every class is kept
                indices = [int(i * len(indices) / max_images) for i in range(max_images)]
        key = content_key(dataset, indices, f"{decoder}|{image_size}")
        if (out_dir / META_FILE).exists() and not rebuild:
            info = _read_info(out_dir)
            if info.content_key == key:
                verified_labels(out_dir, info)
                return info
            print(changed_line("pre-decoded cache", out_dir, info.content_key))
        with built_in_staging(out_dir, "the pre-decoded cache's labels", lambda: 8 * len(indices)) as staging:
            labels, skipped = _write_pixels(staging, dataset, indices, image_size, num_workers)
            if not len(labels):
                raise FileNotFoundError(f"no readable image in {source}; nothing to cache")
            info = CacheInfo(folder=out_dir, images=len(labels), image_size=image_size, classes=list(dataset.classes),
                             source=str(source), pixel_bytes=(staging / PIXELS_FILE).stat().st_size,
                             source_bytes=sum(os.path.getsize(dataset.samples[i][0]) for i in indices),
                             build_seconds=now() - start, skipped=skipped, content_key=key)
            np.save(staging / LABELS_FILE, labels)
            (staging / META_FILE).write_text(json.dumps({k: v for k, v in dataclasses.asdict(info).items()
                                                         if k != "folder"}, indent=2))
        return info


def _write_pixels(staging: Path, dataset, indices: list[int], size: int, num_workers: int) -> tuple[np.ndarray, list]:
    """Decode `indices` of `dataset` into staging/PIXELS_FILE, one row per readable image, in order; returns (their
    labels, the paths left out). Every block is reserved first (`allocate`): a memmap over a sparse file is a
    SIGBUS when the disk fills."""
    from course_lib.data.decode import decode_once

    allocate(staging / PIXELS_FILE, len(indices) * size * size * 3, "the pre-decoded cache's pixels")
    array = np.memmap(staging / PIXELS_FILE, dtype=np.uint8, mode="r+", shape=(len(indices), size, size, 3))
    labels = np.empty(len(indices), dtype=np.int64)
    row, skipped = 0, []
    try:
        for _, image, target, bad_path in decode_once(dataset, indices, num_workers):
            if bad_path:
                log.warning("skipping unreadable image %s (bad_images=skip)", bad_path)
                skipped.append(bad_path)
                continue
            array[row] = image.permute(1, 2, 0).numpy()
            labels[row] = target
            row += 1
        array.flush()
    finally:
        del array
    os.truncate(staging / PIXELS_FILE, row * size * size * 3)  # drop the rows of skipped files
    return labels[:row], skipped


class PreDecodedDataset(torch.utils.data.Dataset):
    """A built cache as a dataset: (transform(uint8 3 x H x W tensor), label).
    The memmap is opened lazily in each process (a forked worker must not share the parent's
    file handle, and pickling a memmap would copy the whole array)."""

    def __init__(self, folder: str | os.PathLike, transform=None):
        self.folder = Path(folder)
        if not (self.folder / META_FILE).exists():
            raise FileNotFoundError(f"no pre-decoded cache in {self.folder}; build it with cache.build_cache()")
        self.info = _read_info(self.folder)
        self.classes = self.info.classes
        self.targets = verified_labels(self.folder, self.info).tolist()
        self.transform = transform
        self._pixels = None

    @property
    def pixels(self) -> np.ndarray:
        if self._pixels is None:
            size = self.info.image_size
            self._pixels = np.memmap(self.folder / PIXELS_FILE, dtype=np.uint8, mode="r",
                                     shape=(self.info.images, size, size, 3))
        return self._pixels

    def __getstate__(self):
        return {**self.__dict__, "_pixels": None}

    def __len__(self):
        return self.info.images

    def __getitem__(self, index):
        # np.array copies the row out of the page cache into memory torch may own.
        image = torch.from_numpy(np.array(self.pixels[index])).permute(2, 0, 1)
        return (self.transform(image) if self.transform else image), self.targets[index]
