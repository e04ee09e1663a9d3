"""Tar shards in WebDataset format: an ImageFolder packed into a few large .tar files (each
sample = `<key>.jpg` with the original bytes + `<key>.cls` with the label), read back as a
sequential stream. Large sequential reads replace one open() per small file; the article reports
"hundreds of images/s from loose files, two to three thousand/s from tar" on the same hardware.
Format and library: https://github.com/webdataset/webdataset
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
from pathlib import Path

import torch

from course_lib.config import ConfigError
from course_lib.data.build_lock import built_in_staging, damaged, exclusive_build
from course_lib.data.datasets import ImageFolderDataset
from course_lib.data.images import BadImageError, skipped_line
from course_lib.instruments.timing import now
from course_lib.paths import CACHE_DIR, project_root

log = logging.getLogger(__name__)
SHARD_PATTERN = "shard-{index:05d}.tar"
INDEX_FILE = "shards.json"  # the ShardSet: shard names, sizes, classes, what was packed


@dataclasses.dataclass
class ShardSet:
    folder: Path
    urls: list  # shard paths, in order
    images: int
    classes: list
    shard_bytes: int  # all shards together
    write_seconds: float
    sizes: list = dataclasses.field(default_factory=list)  # images in each shard, in url order
    skipped: list = dataclasses.field(default_factory=list)  # unreadable files left out (decoder check, skip)
    key: str = ""  # what was packed: source, selection, shard count, checking decoder


def default_shard_dir(source: str | os.PathLike, shard_count: int, selection: str = "") -> Path:
    """data_cache/shards/<folder name>-<count>x-<hash of the source path and `selection`>."""
    digest = hashlib.sha1(f"{Path(source).resolve()}|{selection}".encode()).hexdigest()[:8]
    return project_root() / CACHE_DIR / "shards" / f"{Path(source).name}-{shard_count}x-{digest}"


def read_shard_set(folder: str | os.PathLike) -> ShardSet:
    """The ShardSet written into `folder` (its shards.json)."""
    folder = Path(folder)
    try:
        meta = json.loads((folder / INDEX_FILE).read_text())
        meta["urls"] = [str(folder / name) for name in meta["urls"]]
        return ShardSet(folder=folder, **meta)
    except (ValueError, TypeError, KeyError) as error:
        raise damaged(folder, f"{INDEX_FILE} is unreadable: {str(error).splitlines()[0][:80]}") from None


def verify_shard_set(shard_set: ShardSet) -> ShardSet:
    """Check, before reuse, that every shard is there and that together they hold the bytes the index recorded (a shard
    cut short by a full disk or a killed copy fails here, not as a tar error in a worker). Raises DamagedCacheError."""
    missing = next((url for url in shard_set.urls if not os.path.isfile(url)), None)
    if missing is not None:
        raise damaged(shard_set.folder, f"{Path(missing).name} is missing")
    total = sum(os.path.getsize(url) for url in shard_set.urls)
    if total != shard_set.shard_bytes:
        raise damaged(shard_set.folder, f"its shards hold {total:,} bytes, not the {shard_set.shard_bytes:,} "
                                        f"{INDEX_FILE} recorded (a shard cut short?)")
    return shard_set


def write_shards(source: str | os.PathLike, out_dir: str | os.PathLike, shard_count: int = 8, *,
                 max_images: int = 0, seed: int = 0, indices: list[int] | None = None, decoder: str | None = None,
                 bad_images: str = "fail", num_workers: int = 0, rebuild: bool = False) -> ShardSet:
    """Pack the ImageFolder `source` (its `indices`, else `max_images` spread evenly, 0 = all) into `shard_count`
    tar files under `out_dir`, sizes differing by at most one image, the encoded bytes unchanged (reading back gives
    the original pixels); an out_dir holding the same packing is reused unless `rebuild`. The files are shuffled
    once (seeded): readers shuffle only within a buffer, so class-sorted shards would give class-sorted batches.
    With `decoder`, every file is decoded once first and an unreadable one fails (bad_images=fail) or is left out
    (skip), so a reader's image count is exact."""
    from course_lib.data.cache import changed_line, content_key
    from course_lib.data.decode import FileDecoder

    if shard_count < 1:
        raise ConfigError(f"shard_count must be at least 1, got {shard_count}")
    out_dir = Path(out_dir)
    with exclusive_build(out_dir):
        folder = ImageFolderDataset(source, bad_images=bad_images,
                                    loader=FileDecoder(decoder) if decoder else None)
        if indices is None:  # max_images spread evenly, 0: all
            everything = len(folder.samples)
            indices = ([int(i * everything / max_images) for i in range(max_images)]
                       if max_images and max_images < everything else list(range(everything)))
        key = content_key(folder, indices, f"{shard_count}|{seed}|{decoder}")
        if (out_dir / INDEX_FILE).exists() and not rebuild:
            existing = read_shard_set(out_dir)
            if existing.key == key:
                return verify_shard_set(existing)
            print(changed_line("tar shards", out_dir, existing.key))
        start = now()
        indices, skipped = _readable(folder, indices, num_workers) if decoder else (indices, [])
        if not indices:
            raise FileNotFoundError(f"no readable image in {source}; nothing to pack")
        order = list(indices)
        random.Random(seed).shuffle(order)
        with built_in_staging(out_dir, "the tar shards",
                              lambda: sum(os.path.getsize(folder.samples[index][0]) for index in order)) as staging:
            names, sizes = _pack(staging, folder, order, shard_count)
            meta = {"urls": names, "images": len(order), "classes": list(folder.classes),
                    "shard_bytes": sum(os.path.getsize(staging / name) for name in names),
                    "write_seconds": now() - start, "sizes": sizes, "skipped": skipped, "key": key}
            (staging / INDEX_FILE).write_text(json.dumps(meta, indent=2))
        return read_shard_set(out_dir)


def _readable(folder: ImageFolderDataset, indices: list[int], num_workers: int) -> tuple[list[int], list[str]]:
    """(the indices whose files decode, the paths of those that do not), every file decoded once; an unreadable one
    fails naming the file under bad_images=fail (the folder's loader), or is left out with a warning under skip."""
    from course_lib.data.decode import decode_once

    readable, skipped = [], []
    for index, _, _, bad_path in decode_once(folder, indices, num_workers, keep_pixels=False):
        if bad_path:
            log.warning("leaving unreadable image %s out of the shards (bad_images=skip)", bad_path)
            skipped.append(bad_path)
        else:
            readable.append(index)
    return readable, skipped


def _pack(staging: Path, folder, order: list[int], shard_count: int) -> tuple[list[str], list[int]]:
    """Write the files of `folder` (an ImageFolderDataset) at `order` into `shard_count` tar shards of nearly equal
    size in `staging`, each file's bytes as they are with its label; returns (shard names, images per shard)."""
    import webdataset as wds

    bounds = [shard * len(order) // shard_count for shard in range(shard_count + 1)]
    names, sizes = [], []
    for shard in range(shard_count):
        name = SHARD_PATTERN.format(index=shard)
        members = order[bounds[shard]:bounds[shard + 1]]
        with wds.TarWriter(str(staging / name), encoder=False) as writer:  # encoder=False: bytes as given
            for index in members:
                path, target = folder.samples[index]
                extension = Path(path).suffix.lower().lstrip(".") or "jpg"
                writer.write({"__key__": f"{index:08d}", extension: Path(path).read_bytes(),
                              "cls": str(target).encode()})
        names.append(name)
        sizes.append(len(members))
    return names, sizes


def read_samples(urls: list[str]):
    """(key, extension, encoded bytes, label) for every sample, in shard order: the raw stream,
    for checking a round trip."""
    import webdataset as wds

    for sample in wds.WebDataset(urls, shardshuffle=False, empty_check=False):
        extension = next(k for k in sample if not k.startswith("__") and k != "cls")
        yield sample["__key__"], extension, sample[extension], int(sample["cls"])


def distributed_rank() -> tuple[int, int]:
    """(rank, world size) of this process: torch.distributed's when initialised, else torchrun's
    RANK / WORLD_SIZE environment, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def reader_shards(count: int, rank: int, world_size: int, worker: int, workers: int) -> list[int]:
    """Which of `count` shards one reader (DataLoader worker `worker` of `workers` on rank `rank`
    of `world_size`) reads: every world_size-th shard for the rank, then every workers-th of those
    for the worker (webdataset's split_by_node, then split_by_worker)."""
    return list(range(count))[rank::max(1, world_size)][worker::max(1, workers)]


class ShardDataset(torch.utils.data.IterableDataset):
    """Stream samples from shards: each DDP rank, and each DataLoader worker in it, reads its own shards
    (`reader_shards`; a reader given none yields nothing, see `check_shard_count`), decodes with `decoder`, applies
    `transform`; bad_images="fail" raises naming the shard and key, "skip" logs it. shuffle_buffer > 0 shuffles the
    reader's shards and samples, a new order each epoch (torch's generator, seeded by the engine, mixed with `seed`).
    Sized (`shard_sizes` ... `world_size`, as `pipeline.image_folder_bundle` gives), each reader yields whole
    batches only and `len()` is this rank's images per epoch, so `len(loader)` is exact (a DataLoader batches each
    worker's stream apart: a worker's last partial batch would be short or dropped). Unsized (notebook 02), readers
    follow the loader's worker count and the dataset has no length."""

    splits_by_rank = True  # make_loader: no DistributedSampler needed (nor possible)

    def __init__(self, urls: list[str], transform=None, decoder: str = "pil", bad_images: str = "fail",
                 shuffle_buffer: int = 0, seed: int = 0, classes: list | None = None, *,
                 shard_sizes: list[int] | None = None, batch_size: int = 1, num_workers: int = 0,
                 rank: int = 0, world_size: int = 1):
        self.urls, self.transform, self.decoder_name = list(urls), transform, decoder
        self.bad_images, self.shuffle_buffer, self.seed, self.classes = bad_images, shuffle_buffer, seed, classes
        if shard_sizes is not None and len(shard_sizes) != len(self.urls):
            raise ValueError(f"{len(shard_sizes)} shard sizes for {len(self.urls)} shards")
        self.shard_sizes, self.batch_size, self.num_workers = shard_sizes, max(1, batch_size), num_workers
        self.rank, self.world_size = rank, world_size

    def _quota(self, worker: int) -> int:
        """Images one sized reader yields: its shards' images, cut to whole batches."""
        readers = max(1, self.num_workers)
        images = sum(self.shard_sizes[i] for i in reader_shards(len(self.urls), self.rank, self.world_size,
                                                                worker, readers))
        return images // self.batch_size * self.batch_size

    def __len__(self) -> int:
        if self.shard_sizes is None:
            raise TypeError("this ShardDataset has no length: give it shard_sizes (ShardSet.sizes), batch_size "
                            "and num_workers")
        return sum(self._quota(worker) for worker in range(max(1, self.num_workers)))

    def __iter__(self):
        import webdataset as wds

        from course_lib.data.decode import get_decoder

        info = torch.utils.data.get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        if self.shard_sizes is not None and workers != max(1, self.num_workers):
            raise ConfigError(f"this ShardDataset was sized for {max(1, self.num_workers)} reader(s) per rank but "
                              f"the DataLoader runs {workers}; build the datasets and the loader from the same "
                              "config (num_workers)")
        rank, world_size = (self.rank, self.world_size) if self.shard_sizes is not None else distributed_rank()
        urls = [self.urls[i] for i in reader_shards(len(self.urls), rank, world_size, worker, workers)]
        quota = self._quota(worker) if self.shard_sizes is not None else None
        if not urls or quota == 0:
            return
        decoder, rng = get_decoder(self.decoder_name), None
        if self.shuffle_buffer:
            # A fresh draw per epoch: from the worker's torch generator, which the DataLoader seeds
            # from the main process's, which the engine seeds per (seed, epoch, rank).
            rng = random.Random(f"{self.seed}-{int(torch.randint(2**62, ()))}")
            rng.shuffle(urls)
        stream = wds.WebDataset(urls, shardshuffle=False, nodesplitter=None, workersplitter=None, empty_check=False)
        if rng is not None:
            stream = stream.shuffle(self.shuffle_buffer, rng=rng)
        yielded = 0
        for sample in stream:
            if quota is not None and yielded >= quota:
                return
            extension = next(k for k in sample if not k.startswith("__") and k != "cls")
            source = f"{sample.get('__url__', '?')}:{sample['__key__']}.{extension}"
            try:
                image = decoder.decode(sample[extension], source)
            except BadImageError as error:
                if self.bad_images == "fail":
                    raise
                log.warning("skipping %s", skipped_line(error))
                continue
            yielded += 1
            yield (self.transform(image) if self.transform else image), self._label(sample, source)

    def _label(self, sample: dict, source: str) -> int:
        """The sample's class index, checked against the classes: a label out of range would train on
        a wrong class silently, or fail deep in the loss."""
        try:
            label = int(sample["cls"])
        except (KeyError, ValueError):
            label = -1
        if label < 0 or (self.classes is not None and label >= len(self.classes)):
            raise damaged(Path(sample.get("__url__", "?")).parent,
                          f"{source} has label {sample.get('cls')!r}, not a class index below {len(self.classes or [])}")
        return label


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

