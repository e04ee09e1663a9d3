"""Tar shards in WebDataset format: an ImageFolder packed into a few large .tar files (each
sample = `<key>.jpg` with the original bytes + `<key>.cls` with the label), read back as a
sequential stream. Large sequential reads replace one open() per small file; the article reports
"hundreds of images/s from loose files, two to three thousand/s from tar" on the same hardware.
Format and library: https://github.com/webdataset/webdataset
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import random
import tarfile
import time
from pathlib import Path

import torch

from course_lib.config import ConfigError
from course_lib.data.datasets import BadImageError, ImageFolderDataset

log = logging.getLogger(__name__)
SHARD_PATTERN = "shard-{index:05d}.tar"


@dataclasses.dataclass
class ShardSet:
    folder: Path
    urls: list  # shard paths, in order
    images: int
    classes: list
    shard_bytes: int  # all shards together
    write_seconds: float


def write_shards(source: str | os.PathLike, out_dir: str | os.PathLike, shard_count: int = 8, *,
                 max_images: int = 0, seed: int = 0) -> ShardSet:
    """Pack the ImageFolder `source` into `shard_count` tar files under `out_dir`. The files are
    shuffled once (seeded) before packing, so every shard mixes classes: readers shuffle only
    within a buffer, and class-sorted shards would give class-sorted batches. The encoded bytes
    are stored unchanged (no re-encoding), so reading back gives exactly the original pixels."""
    import webdataset as wds

    if shard_count < 1:
        raise ConfigError(f"shard_count must be at least 1, got {shard_count}")
    start = time.perf_counter()
    folder = ImageFolderDataset(source)
    samples = list(folder.samples)
    if max_images and max_images < len(samples):
        samples = [samples[int(i * len(samples) / max_images)] for i in range(max_images)]
    order = list(range(len(samples)))
    random.Random(seed).shuffle(order)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    per_shard = math.ceil(len(order) / shard_count)
    urls = []
    for shard in range(shard_count):
        url = out_dir / SHARD_PATTERN.format(index=shard)
        with wds.TarWriter(str(url), encoder=False) as writer:  # encoder=False: bytes as given
            for position in order[shard * per_shard:(shard + 1) * per_shard]:
                path, target = samples[position]
                extension = Path(path).suffix.lower().lstrip(".") or "jpg"
                writer.write({"__key__": f"{position:08d}", extension: Path(path).read_bytes(),
                              "cls": str(target).encode()})
        urls.append(str(url))
    return ShardSet(out_dir, urls, len(samples), list(folder.classes),
                    sum(os.path.getsize(u) for u in urls), time.perf_counter() - start)


def read_samples(urls: list[str]):
    """(key, extension, encoded bytes, label) for every sample, in shard order: the raw stream,
    for checking a round trip."""
    import webdataset as wds

    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        extension = next(k for k in sample if not k.startswith("__") and k != "cls")
        yield sample["__key__"], extension, sample[extension], int(sample["cls"])


class ShardDataset(torch.utils.data.IterableDataset):
    """Stream samples from shards: each DataLoader worker (and each DDP rank) reads its own subset
    of shards (webdataset's split_by_node / split_by_worker), decodes with `decoder` and applies
    `transform`. bad_images="fail" raises BadImageError naming the shard and key; "skip" logs it.

    A worker that is given no shard yields nothing, so fewer shards than ranks x workers gives
    ranks different batch counts (see `check_shard_count`)."""

    def __init__(self, urls: list[str], transform=None, decoder: str = "pil", bad_images: str = "fail",
                 shuffle_buffer: int = 0, seed: int = 0, classes: list | None = None):
        self.urls, self.transform, self.decoder_name = list(urls), transform, decoder
        self.bad_images, self.shuffle_buffer, self.seed, self.classes = bad_images, shuffle_buffer, seed, classes

    def __iter__(self):
        import webdataset as wds

        from course_lib.data.decode import get_decoder

        decoder = get_decoder(self.decoder_name)
        stream = wds.WebDataset(self.urls, shardshuffle=len(self.urls) if self.shuffle_buffer else False,
                                nodesplitter=wds.split_by_node, workersplitter=wds.split_by_worker,
                                empty_check=False, seed=self.seed)
        if self.shuffle_buffer:
            stream = stream.shuffle(self.shuffle_buffer)
        for sample in stream:
            extension = next(k for k in sample if not k.startswith("__") and k != "cls")
            source = f"{sample.get('__url__', '?')}:{sample['__key__']}.{extension}"
            try:
                image = decoder.decode(sample[extension], source)
            except BadImageError as error:
                if self.bad_images == "fail":
                    raise
                log.warning("skipping %s", error)
                continue
            yield (self.transform(image) if self.transform else image), int(sample["cls"])


def recommend_shard_count(ranks: int, workers_per_rank: int, total_bytes: int,
                          target_shard_bytes: int = 256 * 2**20) -> int:
    """Shards for `ranks` x `workers_per_rank` readers: a multiple of the readers (every reader
    gets the same number of shards, so no rank runs out early and leaves the others waiting in an
    all-reduce), with shards near `target_shard_bytes` (default 256 MiB; 100 MB-1 GB is usual)."""
    readers = max(1, ranks) * max(1, workers_per_rank)
    per_reader = max(1, math.ceil(total_bytes / (readers * target_shard_bytes)))
    return readers * per_reader


def check_shard_count(shard_count: int, ranks: int, workers_per_rank: int) -> list[str]:
    """Problems with a shard count for ranks x workers, as one-line messages (empty = fine).
    Fewer shards than readers is an error: some workers read nothing, ranks see different numbers
    of batches and DDP hangs at the next gradient all-reduce."""
    readers = max(1, ranks) * max(1, workers_per_rank)
    if shard_count < readers:
        raise ConfigError(
            f"{shard_count} shards for {ranks} rank(s) x {workers_per_rank} worker(s) = {readers} readers: "
            f"{readers - shard_count} reader(s) would get no data and DDP would hang; "
            f"write at least {readers} shards (a multiple of {readers}), or use fewer workers")
    problems = []
    if shard_count % readers:
        problems.append(f"{shard_count} shards do not divide evenly over {readers} readers: some read "
                        f"{shard_count // readers + 1} shards, others {shard_count // readers}, so ranks' batch "
                        f"counts differ; use a multiple of {readers} or cap the epoch (webdataset .with_epoch)")
    return problems


def time_raw_reads(files: list, urls: list[str], repeats: int = 3) -> dict:
    """Bytes/s and files/s of reading the encoded bytes only (no decoding): one open() + read()
    per loose file versus one sequential stream through the tar shards. Median of `repeats`.
    A warm page cache (files read recently) hides most of the storage cost the article measures."""
    import statistics

    def loose():
        return sum(len(Path(path).read_bytes()) for path in files)

    def tar():
        total = 0
        for url in urls:
            with tarfile.open(url, mode="r|") as archive:  # "r|": a pure sequential stream
                for member in archive:
                    if member.isfile() and not member.name.endswith(".cls"):
                        total += len(archive.extractfile(member).read())
        return total

    result = {}
    for name, read in (("loose", loose), ("shards", tar)):
        read()  # warm-up: same page-cache state for both
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            total = read()
            seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds)
        result[f"{name}_files_per_second"] = len(files) / median
        result[f"{name}_megabytes_per_second"] = total / 1e6 / median
    result["shards_speedup"] = result["shards_files_per_second"] / result["loose_files_per_second"]
    return result


def tar_member_names(url: str) -> list[str]:
    """Names inside one shard (for inspection in the notebook)."""
    with tarfile.open(url) as archive:
        return archive.getnames()
