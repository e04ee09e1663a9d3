"""Near-duplicate images and leaks between splits, by perceptual hash (`workbook scan --duplicates`).

A perceptual hash (imagehash's pHash: the signs of the lowest frequencies of a 32x32 greyscale DCT,
64 bits; Zauner 2010, "Implementation and Benchmarking of Perceptual Image Hash Functions") barely
changes when an image is resized, recompressed or slightly shifted in brightness, so two images whose
hashes differ in at most `max_distance` of the 64 bits are near-duplicates. Within a split they
weight one scene twice; across splits (a training image whose copy is in valid or test) they leak:
the held-out score then measures memory, not generalisation. The hashes come from the imagehash
library; the pairwise comparison is one vectorised popcount per image.
"""
from __future__ import annotations

import dataclasses
import os
from collections import Counter
from pathlib import Path

import numpy as np

DEFAULT_MAX_DISTANCE = 4  # bits of 64 in which two pHashes may differ and still be near-duplicates
# pHash reads grey, so flat red, green and blue tiles hash alike (0 bits: 276 false "leaks" between classes, issue
# 49 point 14). Two images whose mean red, green or blue differs by more than this many levels of 255 are not
# near-duplicates, whatever their hashes; a recompression or resize moves the means by a level or two.
COLOUR_TOLERANCE = 32
# Pairs kept to list, closest first; every pair is counted. 8,000 identical images are 32 million pairs:
# kept all, they were an out-of-memory kill (issue 49, point 6).
MAX_LISTED = 10_000


@dataclasses.dataclass(frozen=True)
class Match:
    first: str  # path of one image
    second: str  # path of the other
    first_split: str
    second_split: str
    distance: int  # Hamming distance of the hashes, in bits

    @property
    def leak(self) -> bool:
        """A copy in two different splits."""
        return self.first_split != self.second_split

    def line(self) -> str:
        """One line however the files are named: control characters in a path (a newline, an escape
        sequence) are written as escapes (`scan.printable`)."""
        from course_lib.data.scan import printable

        kind = f"leak {self.first_split}/{self.second_split}" if self.leak else f"duplicate in {self.first_split}"
        return f"{kind} ({self.distance} bits): {printable(self.first)} ~ {printable(self.second)}"


def image_hash(path: str | os.PathLike, hash_size: int = 8) -> np.ndarray:
    """The pHash of one image as `hash_size`**2 booleans (imagehash.phash, on the RGB image)."""
    return image_signature(path, hash_size)[0]


def image_signature(path: str | os.PathLike, hash_size: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(pHash bits as `image_hash`, mean red, green and blue in 0-255) of one image."""
    import imagehash
    from PIL import Image, ImageStat

    with Image.open(path) as image:
        rgb = image.convert("RGB")
        return imagehash.phash(rgb, hash_size=hash_size).hash.flatten(), np.asarray(ImageStat.Stat(rgb).mean)


def pack(bits: list[np.ndarray]) -> np.ndarray:
    """Boolean hashes as rows of uint64 words, for popcount comparisons."""
    packed = np.packbits(np.asarray(bits, dtype=bool), axis=1)
    pad = (-packed.shape[1]) % 8
    return np.pad(packed, ((0, 0), (0, pad))).view(np.uint64)


class Matches(list):
    """The pairs kept to list (closest first, at most `limit` of `find_matches`), with the counts of every
    pair found: `total`, `leaks`, and `between` (leaks per "first split/second split")."""

    def __init__(self, kept=(), total: int | None = None, leaks: int | None = None, between: dict | None = None,
                 unreadable: tuple = ()):
        super().__init__(kept)
        self.unreadable = list(unreadable)  # (path, reason) of the images that could not be hashed
        self.total = len(self) if total is None else total
        self.leaks = sum(match.leak for match in self) if leaks is None else leaks
        self.between = between if between is not None else dict(
            Counter(f"{match.first_split}/{match.second_split}" for match in self if match.leak))

    @property
    def complete(self) -> bool:
        return self.total == len(self)


def find_matches(hashes: np.ndarray, names: list[str], splits: list[str], max_distance: int = DEFAULT_MAX_DISTANCE,
                 limit: int = MAX_LISTED, colours: np.ndarray | None = None) -> Matches:
    """Every pair of rows of `hashes` (`pack`) at most `max_distance` bits apart, once: all counted, the `limit`
    closest kept (memory stays bounded); with `colours` (mean R, G, B), means over COLOUR_TOLERANCE apart: no match."""
    if len(names) != len(hashes) or len(splits) != len(hashes):
        raise ValueError(f"{len(hashes)} hashes need as many names and splits, got {len(names)} and {len(splits)}")
    split_of = np.asarray(splits, dtype=object)
    kept: dict[int, list[Match]] = {}  # distance -> at most `limit` pairs at that distance
    total = leaks = 0
    between: dict[str, int] = {}
    for index in range(len(hashes) - 1):
        # Only the rows after this one: each pair is compared once.
        distances = np.bitwise_count(hashes[index + 1:] ^ hashes[index]).sum(axis=1)
        hits = np.flatnonzero(distances <= max_distance)
        if colours is not None and len(hits):
            hits = hits[np.abs(colours[index + 1 + hits] - colours[index]).max(axis=1) <= COLOUR_TOLERANCE]
        if not len(hits):
            continue
        total += len(hits)
        other_splits = split_of[index + 1 + hits]
        crossed = other_splits != splits[index]
        for other_split, count in zip(*np.unique(other_splits[crossed].astype(str), return_counts=True)):
            key = f"{splits[index]}/{other_split}"
            between[key] = between.get(key, 0) + int(count)
        leaks += int(crossed.sum())
        for distance in np.unique(distances[hits]):
            bucket = kept.setdefault(int(distance), [])
            for offset in hits[distances[hits] == distance][:max(0, limit - len(bucket))]:
                other = index + 1 + int(offset)
                bucket.append(Match(names[index], names[other], splits[index], splits[other], int(distance)))
    ordered = sorted((match for bucket in kept.values() for match in bucket),
                     key=lambda match: (match.distance, match.first, match.second))[:limit]
    return Matches(ordered, total, leaks, between)


def folder_images(root: str | os.PathLike) -> tuple[list[str], list[str]]:
    """(paths, split of each) of the images under `root`: its split folders (train/ val/ valid/ test/)
    when it has them, else `root` as one split named after it. Listed as the loader lists them."""
    from course_lib.data.images import list_image_folder, split_folders

    root = Path(root)
    folders = split_folders(root) or {root.name or "images": root}
    paths, splits = [], []
    for split, folder in folders.items():
        _, samples = list_image_folder(folder)
        paths += [path for path, _ in samples]
        splits += [split] * len(samples)
    return paths, splits


def scan_duplicates(root: str | os.PathLike, max_distance: int = DEFAULT_MAX_DISTANCE, hash_size: int = 8,
                    progress: bool = False) -> tuple[int, list[Match]]:
    """(images hashed, near-duplicate pairs) of an image folder (`folder_images`); paths in the
    matches are relative to `root`."""
    from course_lib.instruments.progress import track

    from PIL import Image

    root = Path(root)
    paths, splits = folder_images(root)
    signatures, names, kept_splits, unreadable = [], [], [], []
    for path, split in track(list(zip(paths, splits)), "hashing", unit="images", enabled=progress):
        try:  # an unreadable, unpermitted or decompression-bomb file is left out and named, not a traceback
            signatures.append(image_signature(path, hash_size))
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            unreadable.append((os.path.relpath(path, root), str(error).splitlines()[0] if str(error) else
                               type(error).__name__))
            continue
        names.append(os.path.relpath(path, root))
        kept_splits.append(split)
    if not signatures:
        return 0, Matches(unreadable=unreadable)
    found = find_matches(pack([bits for bits, _ in signatures]), names, kept_splits, max_distance,
                         colours=np.asarray([colour for _, colour in signatures]))
    found.unreadable = unreadable
    return len(signatures), found


def matches_table(matches: list[Match], limit: int = 0):
    """The matches as a DataFrame (closest first): both images, their splits, the distance, leak or not."""
    import pandas as pd

    rows = [{**dataclasses.asdict(match), "leak": match.leak} for match in matches[:limit or None]]
    return pd.DataFrame(rows, columns=["first", "second", "first_split", "second_split", "distance", "leak"])


def summary(checked: int, matches: list[Match]) -> str:
    counted = matches if isinstance(matches, Matches) else Matches(matches)
    between = sorted(counted.between)
    listed = "" if counted.complete else f"; the {len(counted):,} closest are listed"
    skipped = ""
    if counted.unreadable:
        from course_lib.data.scan import printable

        path, reason = counted.unreadable[0]
        skipped = (f"; {len(counted.unreadable)} image(s) could not be read and were left out (first: "
                   f"{printable(path)}: {printable(reason)}; `workbook scan` lists them all)")
    return (f"hashed {checked} images: {counted.total - counted.leaks} near-duplicate pair(s) within a split, "
            f"{counted.leaks} leak(s) across splits" + (f" ({', '.join(between)})" if between else "") + listed
            + skipped)
